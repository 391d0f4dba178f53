# Convenience targets; the knobs (FLASHATTN_CU_ARCHS, FLASHATTN_CU_HEAD_DIMS, MAX_JOBS, ...) are
# environment variables read by setup.py, e.g. `FLASHATTN_CU_HEAD_DIMS=128 make build`.
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip

.PHONY: build install test clean cpp

# In-place editable build: flashattn_cu/_C*.so next to the sources.
build:
	$(PIP) install --no-build-isolation -v -e .

install:
	$(PIP) install --no-build-isolation -v .

test:
	$(PYTHON) -m pytest -q tests

# The torch-free static library and examples/cpp/attention_demo (CMake, build-cpp/).
cpp:
	cmake -S . -B build-cpp -G Ninja
	cmake --build build-cpp

clean:
	rm -rf build build-cpp dist *.egg-info flashattn_cu/_C*.so
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
