"""How every matmul path stores its outputs (simd.h's narrow_bf16 and store_outputs).

The rounding: torch's float32 -> bf16 cast, bit for bit, including the cases the fast
instruction (VCVTNEPS2BF16) gets differently: denormals, which it reads as zero, and
NaNs, whose payload it keeps. A zero row of x with a float32 bias makes each output
exactly the bias, so the bias is the value rounded.

The float32 logits (linear_float): the same values as linear(...).float(), on every
path the process may take (a dense pack, the bf16 path's quantized pack, the integer
path), for row counts across the kernels' chunking and an output count with a tail.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gguf_support import Q, random_blocks
from verispec import kernels

pytestmark = pytest.mark.skipif(not kernels.available(), reason="kernels unavailable here")

ROOT = Path(__file__).resolve().parents[2]
OUT, IN = 200, 256  # 200: three 64-output groups and a tail of 8


def _special_values() -> torch.Tensor:
    """Lanes that the fast conversion and the integer rule could round apart, mixed with
    ordinary ones in the same 16-lane vectors, and vectors of ordinary values only."""
    tiny = torch.finfo(torch.float32).tiny
    bits = np.array([0x00000001, 0x00007FFF, 0x00008000, 0x00018000, 0x007FFFFF, 0x80000001,
                     0x807FFFFF, 0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FBFFFFF, 0xFF812345,
                     0x3F808000, 0x3F818000, 0x3F80FFFF, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000],
                    dtype=np.uint32)
    special = torch.from_numpy(bits.view(np.float32).copy())
    rng = np.random.default_rng(0)
    ordinary = torch.from_numpy(rng.standard_normal(OUT).astype(np.float32)) * 7
    values = ordinary.clone()
    values[:special.numel()] = special
    values[40:48] = torch.tensor([tiny, -tiny, tiny / 2, 3.0e-39, -1.0e-40, 1e-45, 65504.0, 1.0 + 2**-8])
    values[64:80] = special[:16]  # a vector of special lanes only
    return values  # [80, 200): ordinary vectors


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t.view(torch.int32)


def _torch_cast(values: torch.Tensor) -> torch.Tensor:
    """torch's cast, with any NaN as 0x7FC0 (c10::BFloat16's rule; a vectorized cast may keep
    a payload, the scalar rule does not)."""
    out = values.to(torch.bfloat16)
    return torch.where(values.isnan(), torch.tensor(float("nan"), dtype=torch.bfloat16), out)


def test_outputs_round_like_torch_cast():
    bias = _special_values()
    packed = kernels.pack(torch.randn(OUT, IN).bfloat16())
    for rows in (1, 3, 17):
        y = kernels.linear(torch.zeros(rows, IN, dtype=torch.bfloat16), packed, OUT, bias)
        want = _torch_cast(bias).expand(rows, -1)
        assert torch.equal(_bits(y), _bits(want.contiguous())), rows
        wide = kernels.linear_float(torch.zeros(rows, IN, dtype=torch.bfloat16), packed, OUT, bias)
        assert wide.dtype == torch.float32
        assert torch.equal(_bits(wide), _bits(want.float().contiguous())), rows


def _packs() -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(1)
    raw = torch.from_numpy(random_blocks(Q.Q4_K, OUT, IN, rng).reshape(-1))
    packs = {"dense": kernels.pack(torch.randn(OUT, IN).bfloat16()),
             "q4_k": kernels.pack_quant(raw, int(Q.Q4_K), OUT, IN)}
    if kernels.quant_i8_types():
        packs["q4_k-i8"] = kernels.pack_quant_i8([(raw, int(Q.Q4_K), OUT)], IN)
    return packs


@pytest.mark.parametrize("rows", [1, 4, 8, 9, 17])
def test_float_logits_are_the_bf16_outputs_widened(rows):
    bias = torch.randn(OUT)
    x = torch.randn(rows, IN).bfloat16()
    for name, packed in _packs().items():
        for b in (None, bias):
            narrow = kernels.linear(x, packed, OUT, b)
            wide = kernels.linear_float(x, packed, OUT, b)
            assert wide.dtype == torch.float32 and wide.shape == (rows, OUT)
            assert torch.equal(_bits(wide), _bits(narrow.float())), (name, b is None)


_CHILD = """
import sys, torch
sys.path.insert(0, sys.argv[1])
from test_bf16_outputs import test_outputs_round_like_torch_cast, test_float_logits_are_the_bf16_outputs_widened
from verispec import kernels
assert kernels.isa() == "avx512-bf16", kernels.isa()
test_outputs_round_like_torch_cast()
for rows in (1, 8, 17):
    test_float_logits_are_the_bf16_outputs_widened(rows)
print("ok")
"""


def test_the_avx512_path_stores_alike():
    """The tests above in a process forced off AMX (VERISPEC_MATMUL=avx512): there the dense
    and quantized products store through store_group, not the AMX tile store."""
    here = Path(__file__).resolve().parent
    done = subprocess.run([sys.executable, "-c", _CHILD, str(here)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "VERISPEC_MATMUL": "avx512",
                               "PYTHONPATH": os.pathsep.join([str(here.parent), os.environ.get("PYTHONPATH", "")])},
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]
