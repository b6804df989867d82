"""The kernels' instruction-set dispatch, on whatever CPU runs the tests: init()
picks AMX only where the CPU reports AMX-BF16, VERISPEC_MATMUL=avx512 forces the
AVX-512-BF16 path, and the one build carries the AMX code either way (so a CPU
without AMX still compiles it).

The two paths are two summation orders, not one (matmul.h): the AVX-512 path is
VDPBF16PS's, checked here output by output against that order computed in numpy, and
TDPBF16PS sums a pair its own way, so on an AMX machine a few outputs in ten thousand
differ by a few bf16 ulp. One process uses one path for every product, which is what
speculation's exactness needs; the AMX side is checked against the exact product."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from verispec import kernels
from verispec.kernels.build import cpu_flags, cpu_vendor

pytestmark = pytest.mark.skipif(not kernels.available(), reason="kernels unavailable here")

ROOT = Path(__file__).resolve().parents[2]
# In a fresh process: the isa, then the bits of a dense and a Q4_K product.
_CHILD = """
import sys, numpy as np, torch
from verispec import kernels
x, w, raw = (torch.load(sys.argv[1])[k] for k in ("x", "w", "raw"))
dense = torch.stack([kernels.linear(rows, kernels.pack(w), w.shape[0]) for rows in x])
quant = torch.stack([kernels.linear(rows, kernels.pack_quant(raw, 12, 192, 512), 192) for rows in x])
torch.save({"isa": kernels.isa(), "dense": dense, "quant": quant}, sys.argv[2])
"""


def _inputs(path: Path) -> dict:
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, (192 * 2, 144), dtype=np.uint8)
    raw[:, 0:4] = (rng.uniform(0.01, 0.05, (192 * 2, 2))).astype(np.float16).view(np.uint8)
    generator = torch.Generator().manual_seed(0)
    # 40 draws: one in about seven 5 x 512 x 192 products has an output where the two
    # summation orders round apart on this Xeon (39 of 288,000 outputs in 300 draws).
    data = {"x": torch.randn(40, 5, 512, generator=generator).bfloat16(),
            "w": torch.randn(192, 512, generator=generator).bfloat16(),
            "raw": torch.from_numpy(raw.reshape(-1))}
    torch.save(data, path)
    return data


def _child(tmp_path: Path, env: dict) -> dict:
    out = tmp_path / f"out-{len(list(tmp_path.iterdir()))}.pt"
    subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path / "in.pt"), str(out)], check=True,
                   cwd=ROOT, env={**os.environ, **env}, timeout=300)
    return torch.load(out)


def test_isa_follows_the_cpu_flags():
    flags = cpu_flags()
    if {"amx_tile", "amx_bf16"} <= flags:
        # The OS may still refuse the tile state (then AVX-512 is right too).
        assert kernels.isa() in ("amx", "avx512-bf16")
    else:
        assert kernels.isa() == "avx512-bf16"


def _vdpbf16ps_order(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [n, k] @ w [out, k].T as the AVX-512 path sums it: one float32 accumulator an output,
    from zero, per k pair the odd product and then the even one, each added and rounded (a
    bf16 product is exact in float32, so each step is one rounding, as in VDPBF16PS), then
    rounded once to bf16."""
    xs, ws = x.float().numpy(), w.float().numpy()
    acc = np.zeros((xs.shape[0], ws.shape[0]), np.float32)
    for pair in range(xs.shape[1] // 2):
        for k in (2 * pair + 1, 2 * pair):
            acc = acc + np.outer(xs[:, k], ws[:, k]).astype(np.float32)
    return torch.from_numpy(acc).bfloat16()


def test_the_forced_avx512_path_is_vdpbf16ps_order_bit_for_bit(tmp_path):
    data = _inputs(tmp_path / "in.pt")
    forced = _child(tmp_path, {"VERISPEC_MATMUL": "avx512"})
    assert forced["isa"] == "avx512-bf16"
    q4_k = kernels.dequantize(kernels.pack_quant(data["raw"], 12, 192, 512))
    for i, rows in enumerate(data["x"]):
        assert torch.equal(forced["dense"][i], _vdpbf16ps_order(rows, data["w"])), i
        assert torch.equal(forced["quant"][i], _vdpbf16ps_order(rows, q4_k)), i


def test_the_default_path_is_one_order_in_every_process(tmp_path):
    """The process's own path (AMX here where the OS grants it) gives the same bits in a
    fresh process, and every output is the exact product within float32 summation's error
    and bf16's rounding; where it is AMX, it differs from the AVX-512 order only there."""
    data = _inputs(tmp_path / "in.pt")
    default = _child(tmp_path, {"VERISPEC_MATMUL": ""})
    forced = _child(tmp_path, {"VERISPEC_MATMUL": "avx512"})
    assert default["isa"] == kernels.isa()
    packed = kernels.pack(data["w"])
    here = torch.stack([kernels.linear(rows, packed, 192) for rows in data["x"]])
    assert torch.equal(here, default["dense"])
    exact = torch.einsum("bnk,ok->bno", data["x"].double(), data["w"].double())
    spread = torch.einsum("bnk,ok->bno", data["x"].double().abs(), data["w"].double().abs())
    bound = exact.abs() * 2.0 ** -8 + spread * 512 * 2.0 ** -24
    assert ((default["dense"].double() - exact).abs() <= bound).all()
    if default["isa"] == "avx512-bf16":
        assert torch.equal(default["dense"], forced["dense"])
        assert torch.equal(default["quant"], forced["quant"])
    else:
        apart = default["dense"] != forced["dense"]
        assert apart.float().mean() < 1e-3


def test_the_build_carries_the_amx_path():
    """The AMX matmul is compiled into the module on every CPU: a source change that
    broke it would fail the build here too, not only on an AMX machine."""
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("objdump (binutils) not installed")
    library = kernels._require().__file__
    text = subprocess.run([objdump, "-d", "--no-show-raw-insn", library], capture_output=True, text=True,
                          check=True).stdout
    for instruction in ("ldtilecfg", "tdpbf16ps", "tileloadd", "vdpbf16ps"):
        assert instruction in text, instruction


def test_the_tile_configuration_is_read_only_data():
    """LDTILECFG reads a constant, never a stack object filled just before: GCC's intrinsic
    declares only 8 of its 64 bytes as read, so the other stores may be dropped as dead and
    the next tile instruction faults (llama.cpp's AMX kernels, its PR #26954)."""
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("objdump (binutils) not installed")
    text = subprocess.run([objdump, "-d", "--no-show-raw-insn", kernels._require().__file__],
                          capture_output=True, text=True, check=True).stdout
    loads = [line for line in text.splitlines() if "ldtilecfg" in line]
    assert loads and all("(%rip)" in line for line in loads), loads


def test_the_weight_stream_hint_follows_the_cpu_vendor():
    """The integer path requests its weights non-temporally on AMD only: on an Intel Xeon
    NTA requests were far slower than T0 (docs/notebook/quant_i8_kquant.md, round 8)."""
    if kernels.i8_isa() is None:
        assert kernels.i8_stream_hint() is None
        return
    vendor = cpu_vendor()
    assert kernels.i8_stream_hint() == ("nta" if vendor == "AuthenticAMD" else "t1")
    for isa in kernels.I8_ISAS:  # both modules decide alike
        module = kernels.i8_backend(isa)
        if module is not None:
            assert module.quant_i8_stream_nta() == (vendor == "AuthenticAMD"), isa


def test_each_source_tree_builds_in_its_own_folder(tmp_path, monkeypatch):
    """Two checkouts must not share a build folder: torch keys a build on its sources'
    paths, so they would rebuild it in turn and wait on each other's lock."""
    from verispec.kernels.build import build_dir

    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    ours, other = build_dir(), build_dir(tmp_path / "another checkout")
    assert ours != other and ours.parent == other.parent == tmp_path / "kernels"
    assert build_dir() == ours and ours.is_dir()
