"""Build of flashattn_cu: one CUDAExtension, `flashattn_cu._C`, compiled with ninja.

Knobs (environment variables):
  FLASHATTN_CU_ARCHS       GPU archs to emit machine code for, ";" or "," separated
                           (default "80;90a"). PTX for the lowest listed non-"a" arch is embedded
                           too, so newer GPUs can JIT it.
  FLASHATTN_CU_HEAD_DIMS   head-dim instances to compile (default all: every one listed in
                           csrc/flash/head_dims.h), e.g. "128" or "64,128" for fast iteration;
                           calls with other head dims then fail with "unsupported head dim".
  FLASHATTN_CU_PTXAS_VERBOSE=1   add -Xptxas -v (registers, spills, smem per kernel).
  MAX_JOBS                 parallel compile jobs (read by torch.utils.cpp_extension).
  CUDA_HOME / CUDA_PATH    the CUDA toolkit; when unset, found from where `nvcc` really lives.
"""

import glob
import os
import re
import shutil
import subprocess

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))
DEFAULT_ARCHS = "80;90a"


def head_dim_instances():
    """Every head-dim instance, from the one list: FLASHATTN_CU_HEAD_DIM_INSTANCES in
    csrc/flash/head_dims.h (which dispatch.cu and CMakeLists.txt read too)."""
    header = os.path.join(ROOT, "csrc", "flash", "head_dims.h")
    with open(header) as f:
        m = re.search(r"^#define FLASHATTN_CU_HEAD_DIM_INSTANCES\s+(\d+(?:\s*,\s*\d+)*)\s*$",
                      f.read(), re.M)
    if not m:
        raise RuntimeError(f"{header}: no '#define FLASHATTN_CU_HEAD_DIM_INSTANCES ...' line")
    return tuple(int(x) for x in m.group(1).split(","))


ALL_HEAD_DIMS = head_dim_instances()


def find_cuda_home():
    """The CUDA toolkit root. nvcc on PATH may be a wrapper script (e.g. /usr/local/bin/nvcc), so
    ask nvcc itself: `--dryrun` prints `#$ TOP=<toolkit>/bin/..`."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            return os.environ[var]
    nvcc = shutil.which("nvcc")
    if nvcc:
        try:
            res = subprocess.run([nvcc, "--dryrun", "-x", "cu", "-c", "/dev/null", "-o", "/dev/null"],
                                 capture_output=True, text=True, timeout=60)
            for line in (res.stdout + res.stderr).splitlines():
                m = re.match(r"#\$ TOP=(.+)$", line.strip())
                if m:
                    top = os.path.realpath(m.group(1).strip())
                    if os.path.isfile(os.path.join(top, "bin", "nvcc")):
                        return top
        except (OSError, subprocess.SubprocessError):
            pass
    return "/usr/local/cuda"


# torch.utils.cpp_extension reads CUDA_HOME when it is imported, so settle it first.
os.environ["CUDA_HOME"] = find_cuda_home()

from torch.utils.cpp_extension import BuildExtension, CUDAExtension  # noqa: E402


def parse_list(value):
    return [x for x in re.split(r"[;,\s]+", value.strip()) if x]


def arch_flags(archs):
    """-gencode flags: machine code for each arch, PTX for the lowest portable one."""
    flags = []
    for arch in archs:
        if not re.fullmatch(r"\d+a?", arch):
            raise ValueError(f"FLASHATTN_CU_ARCHS: bad arch {arch!r}; expected e.g. 80, 86, 90a")
        flags += ["-gencode", f"arch=compute_{arch},code=sm_{arch}"]
    portable = sorted((a for a in archs if not a.endswith("a")), key=int)
    if portable:
        flags += ["-gencode", f"arch=compute_{portable[0]},code=compute_{portable[0]}"]
    return flags


def head_dims_from_env():
    raw = os.environ.get("FLASHATTN_CU_HEAD_DIMS", "").strip()
    if not raw or raw.lower() == "all":
        return list(ALL_HEAD_DIMS)
    dims = sorted({int(x) for x in parse_list(raw)})
    bad = [d for d in dims if d not in ALL_HEAD_DIMS]
    if bad:
        raise ValueError(f"FLASHATTN_CU_HEAD_DIMS: {bad} not among the compiled instances {ALL_HEAD_DIMS}")
    return dims


def rel(path):
    return os.path.relpath(path, ROOT)


def sources_for(head_dims):
    srcs = sorted(glob.glob(os.path.join(ROOT, "csrc", "flash", "*.cu")))  # dispatch.cu (+ any stubs)
    # Arch-neutral kernels compiled once (the split-KV combine).
    srcs += sorted(glob.glob(os.path.join(ROOT, "csrc", "flash", "fwd", "*.cu")))
    for d in head_dims:
        # fwd_hdim{D}_{dtype}.cu, and bwd_hdim{D}_{dtype}.cu once they exist.
        srcs += sorted(glob.glob(os.path.join(ROOT, "csrc", "flash", "sm80", "inst", f"*_hdim{d}_*.cu")))
        if "90a" in archs:  # wgmma kernels: sm_90a machine code only
            srcs += sorted(glob.glob(os.path.join(ROOT, "csrc", "flash", "sm90", "inst", f"*_hdim{d}_*.cu")))
    if "90a" in archs:  # the Hopper data-movement self-test (a test hook, sm_90a only)
        srcs.append(os.path.join(ROOT, "csrc", "flash", "sm90", "selftest.cu"))
    srcs += sorted(glob.glob(os.path.join(ROOT, "csrc", "torch", "*.cpp")))
    return [rel(s) for s in srcs]


def version():
    with open(os.path.join(ROOT, "flashattn_cu", "__init__.py")) as f:
        return re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)


archs = parse_list(os.environ.get("FLASHATTN_CU_ARCHS", DEFAULT_ARCHS))
head_dims = head_dims_from_env()
built_archs = ",".join(dict.fromkeys(a.rstrip("a") for a in archs))
# nvcc splits -D values at commas unless escaped ("\\,"); each list initialises an int array.
defines = [
    "-DFLASHATTN_CU_BUILT_HEAD_DIMS=" + "\\,".join(str(d) for d in head_dims),
    "-DFLASHATTN_CU_BUILT_ARCHS=" + built_archs.replace(",", "\\,"),
    f"-DFLASHATTN_CU_HAS_SM90A={int('90a' in archs)}",
]

nvcc_flags = [
    "-O3",
    "-std=c++17",
    "--use_fast_math",
    "-lineinfo",
    # torch adds -D__CUDA_NO_HALF_OPERATORS__ and friends; the kernels use cuda_fp16.h as shipped.
    "-U__CUDA_NO_HALF_OPERATORS__",
    "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_HALF2_OPERATORS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "--expt-relaxed-constexpr",
] + defines + arch_flags(archs)
if os.environ.get("FLASHATTN_CU_PTXAS_VERBOSE", "0") not in ("", "0"):
    nvcc_flags += ["-Xptxas", "-v"]

def shared_libstdcxx_link_args():
    """Link arguments that make the extension use the process's shared libstdc++, or [] when the
    C++ compiler does so by itself.

    A compiler that can only link libstdc++ statically (seen on the H200 image: CXX=/opt/gcc/bin/g++
    has libstdc++.a and no libstdc++.so) puts a private copy of iostreams and locales into the
    extension, next to the shared libstdc++ that torch uses. Numeric formatting through that copy
    (c10::str, TORCH_CHECK messages with numbers, std::ostringstream << int) then crashes with
    SIGSEGV. Naming the libstdc++.so.6 that torch's libc10 loads on the link line makes the linker
    take every libstdc++ symbol from it (NEEDED libstdc++.so.6), so the process keeps one copy.
    scripts/diag_torch_check.py shows the crash and the toolchain facts."""
    import sysconfig
    import tempfile

    cxx = os.environ.get("CXX") or (sysconfig.get_config_var("CXX") or "c++").split()[0]
    with tempfile.TemporaryDirectory() as work:
        src, out = os.path.join(work, "probe.cpp"), os.path.join(work, "probe.so")
        with open(src, "w") as f:
            f.write("#include <sstream>\n#include <string>\n"
                    "std::string f(long x) { std::ostringstream s; s << x; return s.str(); }\n")
        try:
            subprocess.run([cxx, "-fPIC", "-shared", src, "-o", out], check=True,
                           capture_output=True, timeout=120)
            needed = subprocess.run(["readelf", "-d", out], capture_output=True, text=True,
                                    timeout=60).stdout
        except (OSError, subprocess.SubprocessError):
            return []  # no probe possible: leave the link as the toolchain does it
    if "libstdc++.so" in needed:
        return []
    import torch

    libc10 = os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so")
    ldd = subprocess.run(["ldd", libc10], capture_output=True, text=True, timeout=60).stdout
    m = re.search(r"libstdc\+\+\.so\.6 => (\S+)", ldd)
    if not m:
        print(f"setup.py: warning: {cxx} links libstdc++ statically and the libstdc++.so.6 of "
              f"{libc10} was not found; C++ number formatting inside the extension may crash")
        return []
    print(f"setup.py: {cxx} links libstdc++ statically; linking {m.group(1)} (torch's) instead")
    return [m.group(1)]


ext = CUDAExtension(
    name="flashattn_cu._C",
    sources=sources_for(head_dims),
    include_dirs=[os.path.join(ROOT, "csrc", "include"), os.path.join(ROOT, "csrc", "flash")],
    extra_compile_args={"cxx": ["-O3", f"-DFLASHATTN_CU_HAS_SM90A={int('90a' in archs)}"], "nvcc": nvcc_flags},
    extra_link_args=shared_libstdcxx_link_args(),
)

setup(
    name="flashattn_cu",
    version=version(),
    packages=find_packages(include=["flashattn_cu", "flashattn_cu.*"]),
    ext_modules=[ext],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
    zip_safe=False,
)
