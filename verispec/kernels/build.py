"""JIT-build verispec's CPU kernels (the bf16 matmul: AMX in gemv_bf16.cpp,
AVX-512-BF16 in gemv_avx512.cpp, GGUF block formats in quant*.cpp, their
integer path on AVX-512-VNNI in quant_i8*.cpp; the
row-invariant attention in attention.cpp; the fused decoder layers in layer.cpp and gemma_layer.cpp;
suffix decoding's lookup in suffix.cpp; sampling's softmax, top-k/top-p and
draw in sampling.cpp)
once per machine.

One build serves both instruction sets: AMX code runs only where init() found
AMX and the OS granted its tile state, so the module loads on any CPU with
AVX-512-BF16 (Intel Cooper Lake and later, AMD Zen 4 and later).

The build lands in $VERISPEC_CACHE/kernels/<source tree> (default
~/.cache/verispec/kernels/...) and later imports reuse it; torch's cpp_extension rebuilds when the source or
flags change. Anything that stops the kernels (no AVX-512-BF16, no compiler, a
failed build, VERISPEC_NO_KERNELS=1) yields None and one warning: callers keep
their oneDNN path, so the project works without it.

A second, small module (build_vnni256) holds only the integer path, on AVX-VNNI
with 256-bit vectors and no AVX-512 anywhere (quant_i8_vnni256*.cpp, plus the
pack code both modules share): it serves the CPUs with AVX-VNNI and no AVX-512
(Intel Alder Lake and later client cores), with the same bits as the first's
integer path. kernels.i8_isa() says which module runs it.
"""
from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path

_HERE = Path(__file__).parent
_SOURCES = [_HERE / name for name in ("bindings.cpp", "gemv_bf16.cpp", "gemv_avx512.cpp", "quant.cpp",
                                      "quant_formats.cpp", "quant_fused.cpp", "quant_i8.cpp", "quant_i8_pack.cpp",
                                      "quant_i8_legacy.cpp", "quant_i8_k.cpp", "quant_stack.cpp",
                                      "attention.cpp", "layer.cpp", "gemma_layer.cpp", "suffix.cpp",
                                      "sampling.cpp")]
_FLAGS = ["-O3", "-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mamx-tile", "-mamx-bf16", "-mavx512bf16",
          "-fopenmp"]
_REQUIRED = ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16")
ISA_NAMES = {1: "avx512-bf16", 2: "amx"}
_VNNI256_SOURCES = [_HERE / name for name in ("quant_i8_vnni256.cpp", "quant_i8_vnni256_legacy.cpp",
                                              "quant_i8_vnni256_k.cpp", "quant_i8_pack.cpp", "quant_stack.cpp")]
# Hidden symbols: the shared files' functions, compiled here without AVX-512, must
# never bind to the first module's copies. -Wno-psabi: the shared headers declare
# AVX-512 helpers that this module never calls.
_VNNI256_FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-mavxvnni", "-fopenmp", "-fvisibility=hidden", "-Wno-psabi"]
VNNI256_REQUIRED = ("avx2", "fma", "f16c", "avx_vnni")


def _cpuinfo(field: str) -> str:
    """The first /proc/cpuinfo line's value for `field`, or "" where there is none."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    for line in text.splitlines():
        if line.startswith(field):
            return line.split(":", 1)[1].strip()
    return ""


def cpu_flags() -> set[str]:
    return set(_cpuinfo("flags").split())


def cpu_vendor() -> str:
    """"AuthenticAMD", "GenuineIntel", ...: the kernels make some choices by it."""
    return _cpuinfo("vendor_id")


def build_dir(sources: Path = _HERE, module: str = "") -> Path:
    """Where the kernels of the source tree at `sources` are built: one folder per tree.
    torch keys a build on its sources' paths, so two checkouts (a clone beside an
    editable install) sharing a folder rebuilt it in turn, and a process killed mid-build
    left torch's lock behind for the other to wait on."""
    from verispec.paths import cache_root

    tree = hashlib.sha256(str(sources.resolve()).encode()).hexdigest()[:12]
    path = cache_root() / "kernels" / (tree + (f"-{module}" if module else ""))
    path.mkdir(parents=True, exist_ok=True)
    return path


def _load(name: str, sources: list[Path], flags: list[str], required: tuple[str, ...], folder: Path,
          off: str, fallback: str, needs: str):
    """One module, built or reused, or None with one warning ("verispec: <off> (why);
    <fallback>") where the CPU lacks `required`, init() finds no `needs`, or the build fails."""
    if os.environ.get("VERISPEC_NO_KERNELS"):
        return None
    missing = [f for f in required if f not in cpu_flags()]
    if missing:
        warnings.warn(f"verispec: {off} (CPU lacks {', '.join(missing)}); {fallback}", stacklevel=4)
        return None
    try:
        from torch.utils.cpp_extension import load

        # -fopenmp links libgomp.so.1 by soname, which resolves to the copy torch
        # already loaded, so at::parallel_for shares torch's one thread pool.
        module = load(name=name, sources=[str(p) for p in sources], extra_cflags=flags,
                      extra_include_paths=[str(_HERE)], extra_ldflags=["-fopenmp"],
                      build_directory=str(folder), verbose=False)
        if not module.init():
            warnings.warn(f"verispec: {off} (the CPU reports no {needs}); {fallback}", stacklevel=4)
            return None
        return module
    except Exception as err:  # compiler, ninja or headers missing: fall back, don't fail
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:120]
        warnings.warn(f"verispec: {off} (build failed: {first}); {fallback}", stacklevel=4)
        return None


def build():
    """The compiled module, or None (with a warning saying why) when unavailable."""
    return _load("verispec_kernels", _SOURCES, _FLAGS, _REQUIRED, build_dir(), "native kernels off",
                 "using oneDNN", "AVX-512-BF16")


def build_vnni256():
    """The AVX-VNNI integer-path module, or None (with a warning saying why)."""
    return _load("verispec_i8_vnni256", _VNNI256_SOURCES, _VNNI256_FLAGS, VNNI256_REQUIRED,
                 build_dir(module="vnni256"), "the AVX-VNNI integer path is off",
                 "GGUF files take the bf16 path or dense", "AVX-VNNI")
