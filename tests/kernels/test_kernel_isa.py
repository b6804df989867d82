"""The kernels' instruction-set dispatch, on whatever CPU runs the tests: init()
picks AMX only where the CPU reports AMX-BF16, VERISPEC_MATMUL=avx512 forces the
AVX-512-BF16 path, and the one build carries the AMX code either way (so a CPU
without AMX still compiles it). The two paths must give the same bits (matmul.h's
per-element order); on a CPU without AMX both runs below take the AVX-512 path,
and the AMX side of that comparison only runs on an AMX machine."""
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
dense = kernels.linear(x, kernels.pack(w), w.shape[0])
quant = kernels.linear(x, kernels.pack_quant(raw, 12, 192, 512), 192)
torch.save({"isa": kernels.isa(), "dense": dense, "quant": quant}, sys.argv[2])
"""


def _inputs(path: Path) -> dict:
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, (192 * 2, 144), dtype=np.uint8)
    raw[:, 0:4] = (rng.uniform(0.01, 0.05, (192 * 2, 2))).astype(np.float16).view(np.uint8)
    data = {"x": torch.randn(5, 512).bfloat16(), "w": torch.randn(192, 512).bfloat16(),
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


def test_forced_avx512_path_gives_the_same_bits(tmp_path):
    data = _inputs(tmp_path / "in.pt")
    default = _child(tmp_path, {"VERISPEC_MATMUL": ""})
    forced = _child(tmp_path, {"VERISPEC_MATMUL": "avx512"})
    assert forced["isa"] == "avx512-bf16"
    assert default["isa"] == kernels.isa()
    assert torch.equal(default["dense"], forced["dense"])
    assert torch.equal(default["quant"], forced["quant"])
    here = kernels.linear(data["x"], kernels.pack(data["w"]), 192)
    assert torch.equal(here, default["dense"])


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
