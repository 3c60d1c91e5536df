#!/usr/bin/env python3
"""Compile every CUDA kernel file of encore-backend with NVRTC 13.0, without a GPU.

How CI calls it (from the repository root, in `.ci/run`):

    python3 -m pip install --quiet nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.88
    python3 scripts/check-kernels.py

It compiles the headers (HEADERS: `kernels/common.cuh`, then the others) + `<file>.cu` for
every `crates/encore-backend/kernels/*.cu` (one file a core, concurrently) exactly as the
Rust loader does (the headers textually prepended, sources.rs's COMMON; options
`--gpu-architecture=sm_90a --std=c++17 -I<include dir>`), prints one line per file, and
exits non-zero if any file fails, if NVRTC prints anything (warnings count as errors),
if a `.cu` file is missing from `SOURCES` in `src/backend/cuda/kernels/sources.rs` (or listed
there but absent), or if a function name listed in `SOURCES` is not an entry point of the
compiled PTX.

Where things come from (first match wins):
- libnvrtc.so.13: `$NVRTC_LIB` (path to the .so), the `nvidia-cuda-nvrtc` wheel
  (`site-packages/nvidia/cu13/lib`, also under `./.whl` for `pip install --target .whl`),
  `/usr/local/cuda/lib64`. Its sibling `libnvrtc-builtins.so.13.0` is preloaded.
- include dir holding cuda_bf16.h / cuda_fp16.h: `$CUDA_INCLUDE`, the
  `nvidia-cuda-runtime` wheel (`nvidia/cu13/include`), `/usr/local/cuda/include`.
Keep both at CUDA 13.0: newer NVRTC emits PTX the 13.0 driver rejects.

Options: `-v` / `--verbose` also prints ptxas register / shared-memory / spill usage per
kernel (`--ptxas-options=-v`); `--arch sm_XX` overrides the architecture; `--ptx DIR` writes
each file's PTX there (a refactor that must not change the code: diff before and after).
"""

import argparse
import concurrent.futures
import ctypes
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNEL_DIR = ROOT / "crates" / "encore-backend" / "kernels"
HEADERS = ["common.cuh", "quant_gemv.cuh", "quant_mma.cuh", "quant_moe_mma.cuh", "fp8_kv.cuh", "wgmma.cuh"]
KERNELS_RS = ROOT / "crates" / "encore-backend" / "src" / "backend" / "cuda" / "kernels" / "sources.rs"


def candidate_roots():
    """Directories that may contain the `nvidia` namespace package of the wheels."""
    roots = [ROOT / ".whl"]
    for p in sys.path:
        if p:
            roots.append(Path(p))
    try:
        import nvidia  # namespace package installed by the nvidia-* wheels

        for p in getattr(nvidia, "__path__", []):
            roots.append(Path(p).parent)
    except ImportError:
        pass
    return roots


def find_nvrtc():
    env = os.environ.get("NVRTC_LIB")
    if env:
        return Path(env)
    for r in candidate_roots():
        p = r / "nvidia" / "cu13" / "lib" / "libnvrtc.so.13"
        if p.exists():
            return p
    p = Path("/usr/local/cuda/lib64/libnvrtc.so.13")
    if p.exists():
        return p
    sys.exit(
        "check-kernels: libnvrtc.so.13 not found; install it with\n"
        "  python3 -m pip install nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.88\n"
        "or set NVRTC_LIB=/path/to/libnvrtc.so.13"
    )


def find_include():
    env = os.environ.get("CUDA_INCLUDE")
    if env:
        return Path(env)
    for r in candidate_roots():
        p = r / "nvidia" / "cu13" / "include"
        if (p / "cuda_bf16.h").exists():
            return p
    p = Path("/usr/local/cuda/include")
    if (p / "cuda_bf16.h").exists():
        return p
    sys.exit(
        "check-kernels: cuda_bf16.h not found; install the headers with\n"
        "  python3 -m pip install nvidia-cuda-runtime==13.0.88\n"
        "or set CUDA_INCLUDE=/path/to/cuda/include"
    )


class Nvrtc:
    def __init__(self, path):
        builtins = sorted(path.parent.glob("libnvrtc-builtins.so.13*"))
        for b in builtins:
            if ".alt." not in b.name:
                # NVRTC dlopens its builtins by soname; load it first so that succeeds
                # without LD_LIBRARY_PATH.
                ctypes.CDLL(str(b), mode=ctypes.RTLD_GLOBAL)
                break
        self.lib = ctypes.CDLL(str(path))
        self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.check(self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        self.version = (major.value, minor.value)

    def check(self, rc, what):
        if rc != 0:
            raise RuntimeError(f"{what}: {self.lib.nvrtcGetErrorString(rc).decode()}")

    def compile(self, src, name, options):
        """Returns (ok, log, ptx)."""
        prog = ctypes.c_void_p()
        self.check(
            self.lib.nvrtcCreateProgram(
                ctypes.byref(prog), src.encode(), name.encode(), 0, None, None
            ),
            "nvrtcCreateProgram",
        )
        try:
            opts = [o.encode() for o in options]
            arr = (ctypes.c_char_p * len(opts))(*opts)
            rc = self.lib.nvrtcCompileProgram(prog, len(opts), arr)
            size = ctypes.c_size_t()
            self.check(self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "log size")
            buf = ctypes.create_string_buffer(size.value)
            self.check(self.lib.nvrtcGetProgramLog(prog, buf), "log")
            log = buf.value.decode(errors="replace").strip()
            if rc != 0:
                return False, log, ""
            self.check(self.lib.nvrtcGetPTXSize(prog, ctypes.byref(size)), "PTX size")
            buf = ctypes.create_string_buffer(size.value)
            self.check(self.lib.nvrtcGetPTX(prog, buf), "PTX")
            return True, log, buf.value.decode(errors="replace")
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))


def parse_sources():
    """(file, src path, [functions]) for every KernelSource in kernels/sources.rs."""
    if not KERNELS_RS.exists():
        sys.exit(f"check-kernels: {KERNELS_RS} not found")
    # sources.rs holds SOURCES; sources_quant.rs the quantized formats' entries it names.
    text = KERNELS_RS.read_text() + (KERNELS_RS.parent / "sources_quant.rs").read_text()
    entries = []
    pat = re.compile(
        r"KernelSource\s*\{\s*file:\s*\"([^\"]+)\"\s*,\s*src:\s*include_str!\(\s*\"([^\"]+)\"\s*\)"
        r"\s*,\s*functions:\s*&\[(.*?)\]\s*,?\s*\}",
        re.S,
    )
    for m in pat.finditer(text):
        funcs = re.findall(r"\"([^\"]+)\"", m.group(3))
        entries.append((m.group(1), m.group(2), funcs))
    if not entries:
        sys.exit(f"check-kernels: no KernelSource entries parsed from {KERNELS_RS}")
    return entries


def ptxas_summary(log):
    """Condense ptxas -v output into one line per function."""
    out, fn = [], None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            fn = m.group(1)
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and fn:
            stack = f"stack {m.group(1)}B spill st/ld {m.group(2)}/{m.group(3)}B"
            out.append([fn, stack, ""])
            continue
        m = re.search(r"Used (\d+) registers(.*)", line)
        if m and out and out[-1][0] == fn:
            smem = re.search(r"(\d+) bytes smem", m.group(2))
            out[-1][2] = f"{m.group(1)} regs, smem {smem.group(1) if smem else 0}B"
    return [f"    {f:32s} {r:22s} {s}" for f, s, r in out]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-v", "--verbose", action="store_true", help="print ptxas resource usage")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("-D", dest="defines", action="append", default=[],
                    help="NAME=VALUE passed as a define (as ENCORE_KERNEL_DEFINES does)")
    ap.add_argument("files", nargs="*", help="only these .cu files (default: all)")
    ap.add_argument("--ptx", metavar="DIR",
                    help="also write each file's PTX to DIR/<file>.ptx (to diff a refactor's output)")
    args = ap.parse_args()

    nvrtc = Nvrtc(find_nvrtc())
    include = find_include()
    print(f"check-kernels: NVRTC {nvrtc.version[0]}.{nvrtc.version[1]}, include {include}")
    if nvrtc.version[0] != 13 or nvrtc.version[1] != 0:
        print(f"check-kernels: warning: expected NVRTC 13.0 (the driver on the H100 is 13.0)")

    # The headers, in sources.rs's COMMON order.
    common = "".join((KERNEL_DIR / h).read_text() for h in HEADERS)
    entries = parse_sources()
    failures = []

    listed = {f for f, _, _ in entries}
    on_disk = {p.name for p in KERNEL_DIR.glob("*.cu")}
    for missing in sorted(on_disk - listed):
        failures.append(f"{missing}: not listed in SOURCES ({KERNELS_RS.name})")
    for extra in sorted(listed - on_disk):
        failures.append(f"{extra}: listed in SOURCES but not found in {KERNEL_DIR}")

    options = [f"--gpu-architecture={args.arch}", "--std=c++17", f"-I{include}"]
    options += [f"-D{d}" for d in args.defines]
    if args.verbose:
        options.append("--ptxas-options=-v")
    def compile_one(file):
        t0 = time.time()
        result = nvrtc.compile(common + (KERNEL_DIR / file).read_text(), file, options)
        return result, time.time() - t0

    # NVRTC compiles independent programs concurrently (ctypes releases the GIL): one file
    # a core; the results are reported in SOURCES order.
    present = [file for file, _, _ in entries if (KERNEL_DIR / file).exists()
               and (not args.files or file in args.files)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        compiled = dict(zip(present, pool.map(compile_one, present)))
    for file, src_path, funcs in entries:
        if f"/kernels/{file}" not in src_path:
            failures.append(f"{file}: include_str! path {src_path!r} does not name the file")
        if file not in compiled:
            continue
        (ok, log, ptx), dt = compiled[file]
        if args.ptx and ok:
            Path(args.ptx).mkdir(parents=True, exist_ok=True)
            (Path(args.ptx) / f"{file}.ptx").write_text(ptx)
        problems = []
        if not ok:
            problems.append("compile error")
        # ptxas -v prints "ptxas info" lines (and continuations); everything else NVRTC prints is a warning or error.
        noise = [
            l for l in log.splitlines()
            if l.strip() and not (args.verbose and l.startswith("ptxas"))
        ]
        if ok and noise:
            problems.append("warnings")
        entries_ptx = set(re.findall(r"\.entry\s+(\w+)", ptx))
        missing = [f for f in funcs if ok and f not in entries_ptx]
        if missing:
            problems.append("missing functions: " + ", ".join(missing))
        unlisted = sorted(entries_ptx - set(funcs))
        if ok and unlisted:
            problems.append("entry points not listed in SOURCES: " + ", ".join(unlisted))
        status = "ok  " if not problems else "FAIL"
        print(f"{status} {file:16s} {len(funcs):3d} functions  {dt:5.2f} s"
              + ("" if not problems else "  (" + "; ".join(problems) + ")"))
        if noise:
            print("\n".join("    " + l for l in noise))
        if args.verbose and ok:
            print("\n".join(ptxas_summary(log)))
        if problems:
            failures.append(f"{file}: " + "; ".join(problems))

    if failures:
        print("check-kernels: FAILED")
        for f in failures:
            print(f"  {f}")
        sys.exit(1)
    print(f"check-kernels: {len(entries)} files compiled cleanly for {args.arch}")


if __name__ == "__main__":
    main()
