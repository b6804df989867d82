"""A native target read straight from a GGUF file.

Apart from `NativeLlama` because reading a file needs the per-architecture
readers (gguf_arch), which build Gemma's pieces, and Gemma's model is a
NativeLlama: a method on the model would close that loop.
"""
from __future__ import annotations

import torch

from verispec.models.gemma import NativeGemma
from verispec.models.gguf_weights import read_gguf
from verispec.models.llama import DEFAULT_CACHE_LIMIT, NativeLlama


def native_from_gguf(path, dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cpu",
                     quant: bool = True, batch_invariant: bool = False,
                     cache_limit: int = DEFAULT_CACHE_LIMIT, quiet: bool = False,
                     int8: bool = False) -> NativeLlama:
    """A target from a GGUF file (a path or an open GGUFFile): quant=True keeps the
    weights in their blocks for the kernels, quant=False dequantizes them to `dtype`;
    int8=True (with quant) multiplies the blocks by int8-rounded activations
    (kernels.pack_quant_i8), as llama.cpp does."""
    device = torch.device(device)
    model = read_gguf(path, dtype, device, quant, quiet, int8)
    name = f"native:{model.path.stem}"
    if model.gemma is not None:
        return NativeGemma(model.spec, model.gemma, model.weights, model.norms, dtype, device,
                           model.eos_token_ids, name=name, batch_invariant=batch_invariant,
                           cache_limit=cache_limit)
    return NativeLlama(model.spec, model.weights, dtype, device, model.eos_token_ids, name=name,
                       batch_invariant=batch_invariant, cache_limit=cache_limit)
