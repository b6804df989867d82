"""`verispec profile`'s bandwidth bound needs the bytes one decode step reads. For a
native target they are counted from its weights as they run (GGUF blocks, int8 tiles or
bf16): here against the file's own tensors, counted independently."""
from __future__ import annotations

import pytest
import torch
from gguf_support import Q4_K_M, TinyShape, write_tiny_gguf

from verispec import kernels
from verispec.bench.profile import weight_bytes
from verispec.models.gguf_file import GGUFFile
from verispec.models.native_gguf import native_from_gguf

PATHS = [("dense", {"quant": False}), ("quant", {"quant": True}), ("quant-i8", {"quant": True, "int8": True})]


def _file_bytes(path, tied: bool, dense: bool) -> int:
    """Every tensor a step reads in full: all but the input embedding, which is the LM
    head when tied. Dense: 2 bytes (bf16) an element; else the blocks as stored."""
    gf = GGUFFile(path)
    total = 0
    for name, info in gf.tensors.items():
        if name == "token_embd.weight" and not tied:
            continue
        raw = gf.raw(name)
        elements = 1
        for size in info.shape:
            elements *= int(size)
        total += 2 * elements if dense else raw.nbytes
    gf.close()
    return total


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("name,options", PATHS, ids=[p[0] for p in PATHS])
def test_a_native_targets_step_bytes_are_its_matrices(tmp_path, name, options, tied):
    if name != "dense" and not kernels.available():
        pytest.skip("kernels off on this CPU")
    if name == "quant-i8" and not kernels.quant_i8_types():
        pytest.skip("no integer path on this CPU")
    path = write_tiny_gguf(tmp_path / "tiny.gguf", Q4_K_M, TinyShape(intermediate=768, tied=tied))
    model = native_from_gguf(path, torch.bfloat16, **options)
    assert model.weights_kind == name
    expected = _file_bytes(path, tied, dense=name == "dense")
    # Packs pad ragged tiles (300 vocabulary rows) and hold scales per tile: a few % more.
    assert expected <= weight_bytes(model) <= 1.05 * expected
