"""The CUDA side of loading: cuBLAS's batch-invariant settings, and which native
models take the static path (static_llama) there.

cuBLAS picks a matmul's algorithm, split and workspace from its shapes; with a
workspace it may split the reduction differently as the row count changes, so a
row's bits would depend on how many rows share its matmul. The settings below
(vLLM's batch-invariant ones) pin that: a 16 KiB x 8 cuBLAS workspace, a 1 KiB
cuBLASLt one (no split-K), no reduced-precision reductions or TF32, cuBLASLt
first. cuBLAS reads the two variables once, when its handles are created, so they
are set before the first cuBLAS call and stay for the whole process.
"""
from __future__ import annotations

import os
import sys

import torch

BLAS_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":16:8", "CUBLASLT_WORKSPACE_SIZE": "1"}
# Set to 1 to leave cuBLAS at its defaults: only for measuring what the settings
# cost (scripts/gpu_check.py); the self-check then decides whether speculation runs.
DEFAULT_BLAS_ENV = "VERISPEC_CUDA_DEFAULT_BLAS"
_applied: dict[str, str] | None = None


def batch_invariant_blas() -> dict[str, str]:
    """Apply the settings once per process; returns what is in force (for reports)."""
    global _applied
    if _applied is not None:
        return _applied
    if os.environ.get(DEFAULT_BLAS_ENV) == "1":
        _applied = {"cublas": "library defaults (VERISPEC_CUDA_DEFAULT_BLAS=1)"}
        return _applied
    for name, value in BLAS_ENV.items():
        if os.environ.get(name, value) != value:
            print(f"verispec: {name}={os.environ[name]} replaced by {value} for row-invariant "
                  "matmuls", file=sys.stderr)
        os.environ[name] = value
    matmul = torch.backends.cuda.matmul
    matmul.allow_tf32 = False
    matmul.allow_bf16_reduced_precision_reduction = False
    matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.preferred_blas_library("cublaslt")
    _applied = {**BLAS_ENV, "allow_tf32": "False", "reduced_precision_reductions": "False",
                "preferred_blas_library": "cublaslt"}
    return _applied


def static_unsupported(native_class) -> str:
    """Why a native model class cannot take the static CUDA path, or "" if it can:
    the path is the Llama family's decoder (Llama, Mistral, Qwen2/3, Phi-3)."""
    from .llama import NativeLlama

    if native_class is not NativeLlama:
        return (f"the CUDA path runs the Llama family; {native_class.__name__} has its own "
                "decoder, which runs there only through transformers")
    return ""


def on_cuda(target, width: int | None = None):
    """A NativeLlama loaded on CUDA as the static path, with its start-up self-check
    run (static_llama, row_check). Anything else is returned as it is."""
    from .llama import NativeLlama
    from .row_check import check_rows
    from .static_llama import DEFAULT_WIDTH, StaticLlama

    if target.device.type != "cuda" or type(target) is not NativeLlama:
        return target
    model = StaticLlama.from_native(target, width or DEFAULT_WIDTH)
    model.row_check = check_rows(model)
    if not model.row_check.ok:
        print(f"verispec: {model.row_check.refusal()}", file=sys.stderr)
    return model
