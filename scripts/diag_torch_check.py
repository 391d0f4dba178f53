"""Why does a TORCH_CHECK whose message streams a number crash a torch extension on some machines?

Seen on the H200 image (g++ 13.3, torch 2.11.0+cu130): `TORCH_CHECK(false, "x ", 5)` in an
extension (ours, or a trivial load_inline one) killed the process with SIGSEGV instead of raising.
This script builds one small load_inline extension whose functions each fail a different way,
calls each in a child process (so a crash is contained and reported), and prints the toolchain
facts that decide the cause: the compilers of torch and of the extension, the libstdc++ each
process maps, the C++ ABI flag. Where a child crashes and cuda-gdb is present (it debugs host
code too), a backtrace is printed.

    python3 scripts/diag_torch_check.py            # prints a table; exit 1 if any case crashed
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile

CASES = {
    # name: (C++ body, what it shows)
    "literal": ('TORCH_CHECK(false, "a literal message");', "TORCH_CHECK, const char* only"),
    "with_int": ('TORCH_CHECK(false, "an int64 ", (int64_t)60);', "TORCH_CHECK streaming an int64"),
    "with_double": ('TORCH_CHECK(false, "a double ", 0.5);', "TORCH_CHECK streaming a double"),
    "value_literal": ('TORCH_CHECK_VALUE(false, "a literal");', "c10::ValueError, literal"),
    "value_string": ('TORCH_CHECK_VALUE(false, std::string("a string ") + std::to_string(60));',
                     "c10::ValueError from a std::string built without streams"),
    "check_string": ('TORCH_CHECK(false, std::string("a string ") + std::to_string(60));',
                     "c10::Error from a std::string built without streams"),
    "ostream_only": ('std::ostringstream ss; ss << 60; if (ss.str() != "60") throw 1;',
                     "std::ostringstream << int, no throw (returns normally)"),
    "c10_str_only": ('auto s = c10::str("n=", 60); if (s != "n=60") throw 1;',
                     "c10::str with an int, no throw (returns normally)"),
    "std_exception": ('throw std::invalid_argument(std::string("n=") + std::to_string(60));',
                      "std::invalid_argument"),
}

SOURCE_HEAD = """
#include <torch/extension.h>
#include <sstream>
#include <stdexcept>
#include <string>
"""


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=60).stdout.strip()
    except Exception as exc:  # noqa: BLE001
        return f"({exc})"


def mapped_libs(pid="self"):
    try:
        with open(f"/proc/{pid}/maps") as f:
            paths = {line.split()[-1] for line in f if "/" in line}
    except OSError:
        return []
    return sorted(p for p in paths if re.search(r"libstdc\+\+|libgcc_s|libc10\.so", p))


def probe_toolchain(cxx):
    """Does `cxx` link libstdc++ into a shared object dynamically (NEEDED libstdc++.so.6) or
    statically (its own copy of iostreams and locales inside the .so)?"""
    print(f"-- {cxx}: {sh(f'{cxx} --version | head -1')}")
    print("   libstdc++.so:", sh(f"{cxx} -print-file-name=libstdc++.so"),
          "| libstdc++.a:", sh(f"{cxx} -print-file-name=libstdc++.a"))
    print("   specs mentioning static:", sh(f"{cxx} -dumpspecs | grep -n 'static' | head -5 | tr '\\n' ' '")[:300])
    work = tempfile.mkdtemp(prefix="probe_")
    src = os.path.join(work, "p.cpp")
    with open(src, "w") as f:
        f.write('#include <sstream>\n#include <string>\nstd::string f(long x) { std::ostringstream s; s << x; return s.str(); }\n')
    for label, extra in (("default", ""), ("explicit -lstdc++", "-lstdc++"),
                         ("-Wl,-Bdynamic -lstdc++", "-Wl,-Bdynamic -lstdc++")):
        out = os.path.join(work, "p.so")
        res = subprocess.run(f"{cxx} -O2 -fPIC -shared {src} -o {out} {extra}", shell=True,
                             capture_output=True, text=True)
        needed = sh(f"readelf -d {out} | grep NEEDED | grep -o '\\[.*\\]' | tr '\\n' ' '") if res.returncode == 0 else res.stderr[-200:]
        inside = sh(f"nm -C --defined-only {out} | grep -c 'basic_ostream<char, std::char_traits<char> >::_M_insert'") if res.returncode == 0 else "-"
        print(f"   link {label:24s}: NEEDED {needed} | ostream _M_insert defined inside: {inside}")


def child(build_dir, name):
    sys.path.insert(0, build_dir)
    import torch  # noqa: F401
    import diag_ext

    print("maps:", mapped_libs())
    try:
        getattr(diag_ext, name)()
        print("RESULT returned")
    except Exception as exc:  # noqa: BLE001
        print(f"RESULT raised {type(exc).__name__}: {str(exc).splitlines()[0][:100]}")


def main():
    if len(sys.argv) == 3:
        return child(sys.argv[1], sys.argv[2])
    import torch
    from torch.utils.cpp_extension import load_inline

    print("== toolchain")
    print("python", sys.version.split()[0], sys.executable)
    print("torch", torch.__version__, "CXX11 ABI", torch._C._GLIBCXX_USE_CXX11_ABI)
    config = torch.__config__.show()
    for line in config.splitlines():
        if re.search(r"GCC|gcc|clang|CXX_COMPILER|CXX_FLAGS|C\+\+ Version", line):
            print("torch build:", line.strip()[:300])
    print("c++:", sh("c++ --version | head -1"), "| g++:", sh("g++ --version | head -1"))
    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    print("libc10 needs:", sh(f"ldd {lib}/libc10.so | grep -E 'stdc|gcc_s'"))
    print("libc10 GCC notes:", sh(f"strings -a {lib}/libc10.so | grep -E '^GCC: \\(' | sort -u | head -3"))
    print("GLIBCXX in libc10:", sh(f"objdump -T {lib}/libc10.so | grep -o 'GLIBCXX_[0-9.]*' | sort -uV | tail -2"))
    print("libstdc++ of this process:", mapped_libs())
    print("bundled libstdc++ in the venv:", sh(f"find {os.path.dirname(os.path.dirname(torch.__file__))} -name 'libstdc++*' | head"))

    print("CXX env:", os.environ.get("CXX"), "| CC env:", os.environ.get("CC"))
    print("which -a g++ c++:", sh("which -a g++ c++ | tr '\\n' ' '"))
    cxx = os.environ.get("CXX") or "c++"
    for compiler in dict.fromkeys([cxx, "/usr/bin/g++"]):
        probe_toolchain(compiler)
    so = sorted(__import__("glob").glob(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                     "..", "flashattn_cu", "_C*.so")))
    for path in so:
        print("flashattn_cu _C NEEDED:", sh(f"readelf -d {path} | grep NEEDED | grep -o '\\[.*\\]' | tr '\\n' ' '"))
        print("flashattn_cu _C ostream symbols defined inside:",
              sh(f"nm -C --defined-only {path} | grep -c 'std::basic_ostream<char, std::char_traits<char> >::_M_insert'"))

    build_dir = tempfile.mkdtemp(prefix="diag_ext_")
    funcs = [f"void {n}() {{ {body} }}" for n, (body, _) in CASES.items()]
    load_inline("diag_ext", cpp_sources=[SOURCE_HEAD + "\n".join(funcs)], functions=list(CASES),
                build_directory=build_dir, verbose=True)
    print("extension GLIBCXX needs:", sh(f"objdump -T {build_dir}/diag_ext*.so | grep -o 'GLIBCXX_[0-9.]*' | sort -uV | tail -2"))

    print("\n== cases (each in a child process)")
    crashed = []
    for name, (_, what) in CASES.items():
        res = subprocess.run([sys.executable, __file__, build_dir, name], capture_output=True,
                             text=True, timeout=120)
        result = [line for line in res.stdout.splitlines() if line.startswith("RESULT")]
        outcome = result[0][7:] if result else f"CRASH (exit {res.returncode})"
        if not result:
            crashed.append(name)
        print(f"{name:15s} {what:60s} -> {outcome}")
        if name == "literal":
            print("   child maps:", [line for line in res.stdout.splitlines() if line.startswith("maps")])
    gdb = shutil.which("cuda-gdb")
    for name in crashed[:2]:
        if not gdb:
            break
        print(f"\n== backtrace of {name} (cuda-gdb)")
        res = subprocess.run([gdb, "-batch", "-ex", "run", "-ex", "bt 25", "--args", sys.executable,
                              __file__, build_dir, name], capture_output=True, text=True, timeout=240)
        lines = [line for line in res.stdout.splitlines() if line.startswith("#") or "signal" in line]
        print("\n".join(lines[:40]) or res.stdout[-3000:])
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
