"""The integer path's AVX-VNNI module (kernels/quant_i8_vnni256*.cpp): every output bit
for bit the AVX-512 module's on the same pack, a row's bits its own alone, the choice
between the two modules, and the law on a model forced onto the 256-bit module.

tests/kernels/test_quant_i8.py holds the AVX-512 module to a reference computed step by
step; equality with it carries that over here.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import VOCAB, CharTokenizer
from gguf_support import Q, TinyShape, write_tiny_gguf, write_tiny_kquant
from test_quant_i8 import _bits, _raw, _x

from verispec import Engine, SamplingParams, SpecConfig, kernels
from verispec.models import loading

FORMATS = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K]
BIG, SMALL = kernels.i8_backend("avx512-vnni"), kernels.i8_backend("avx-vnni")
both = pytest.mark.skipif(BIG is None or SMALL is None,
                          reason="needs a CPU with both AVX-512-VNNI and AVX-VNNI, and both modules")


def _pack(parts: list[tuple[np.ndarray, Q, int]], inp: int) -> torch.Tensor:
    return BIG.pack_quant_i8([torch.from_numpy(r) for r, _, _ in parts], [int(t) for _, t, _ in parts],
                             [o for _, _, o in parts], inp)


def _threads(count: int):
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    return before


def _accumulators(module, row: torch.Tensor, packed: torch.Tensor, out: int) -> torch.Tensor:
    """One row's float32 accumulators, exactly, though linear() rounds its outputs to bf16:
    a float32 bias of minus what is known so far leaves the next 8 bits of each
    (the subtraction is exact, Sterbenz), and three passes give all 24."""
    known = torch.zeros(out, dtype=torch.float64)
    for _ in range(3):
        known += module.linear(row, packed, out, (-known).float()).double()[0]
    return known


def _same_bits_every_row_count(packed: torch.Tensor, out: int, inp: int, bias: torch.Tensor | None) -> None:
    """n = 1..16 rows: the 256-bit module's bits are the AVX-512 module's, and each
    row's are that row's alone, at 1 and 2 threads."""
    x = _x(16, inp, seed=inp + out)
    if bias is None:  # every fp32 bit, not only the 16 a bf16 output keeps
        for r in range(16):
            assert torch.equal(_accumulators(SMALL, x[r:r + 1], packed, out),
                               _accumulators(BIG, x[r:r + 1], packed, out)), r
    alone = torch.cat([SMALL.linear(x[r:r + 1], packed, out, bias) for r in range(16)])
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for n in range(1, 17):
                start = (3 * n) % (17 - n)  # a row window that moves with n
                rows = x[start:start + n]
                small = SMALL.linear(rows, packed, out, bias)
                assert torch.equal(_bits(small), _bits(BIG.linear(rows, packed, out, bias))), (threads, n)
                assert torch.equal(_bits(small), _bits(alone[start:start + n])), (threads, n)
    finally:
        torch.set_num_threads(before)


@both
@pytest.mark.parametrize("qtype", FORMATS, ids=lambda t: t.name)
def test_bits_equal_the_avx512_module(qtype):
    # odd out (a ragged last half and tile), several groups; for the 32-weight formats
    # an odd block count, for the K-quants one and three super-blocks
    shapes = [(37, 96), (150, 800)] if qtype < Q.Q4_K else [(37, 256), (150, 768)]
    for out, inp in shapes:
        packed = _pack([(_raw(qtype, out, inp, seed=out), qtype, out)], inp)
        bias = torch.randn(out, generator=torch.Generator().manual_seed(3)).bfloat16()
        for b in (None, bias):
            _same_bits_every_row_count(packed, out, inp, b)


@both
def test_mixed_stack_equals_the_avx512_module():
    """A Q4_K_M stack (Q4_K q/k beside Q6_K v), a Q5_K part and a 32-weight part."""
    inp = 512
    specs = [(Q.Q4_K, 128), (Q.Q6_K, 64), (Q.Q4_1, 64), (Q.Q8_0, 64), (Q.Q5_K, 37)]
    parts = [(_raw(t, o, inp, seed=i), t, o) for i, (t, o) in enumerate(specs)]
    _same_bits_every_row_count(_pack(parts, inp), sum(o for _, o in specs), inp, None)


@both
def test_large_values_and_threads_share_the_groups():
    """Enough 64-output groups for two threads to split them, and rows of large
    magnitude (no saturation or overflow difference between the modules)."""
    out, inp = 1024, 512
    for qtype in (Q.Q4_1, Q.Q8_0, Q.Q6_K):
        packed = _pack([(_raw(qtype, out, inp, seed=9), qtype, out)], inp)
        x = (_x(9, inp, seed=2).float() * 1e4).bfloat16()
        before = _threads(2)
        try:
            assert torch.equal(_bits(SMALL.linear(x, packed, out)), _bits(BIG.linear(x, packed, out)))
        finally:
            torch.set_num_threads(before)


@both
@pytest.mark.parametrize("qtype", [Q.Q5_0, Q.Q4_K, Q.Q6_K], ids=lambda t: t.name)
def test_embedding_and_packs_are_shared(qtype):
    out, inp = 101, 512
    raw = _raw(qtype, out, inp, seed=11)
    mine = SMALL.pack_quant_i8([torch.from_numpy(raw)], [int(qtype)], [out], inp)
    theirs = _pack([(raw, qtype, out)], inp)
    assert torch.equal(mine, theirs)
    ids = torch.tensor([[0, 17, 100], [63, 64, 5]])
    assert torch.equal(_bits(SMALL.embedding(mine, ids)), _bits(BIG.embedding(theirs, ids)))
    assert SMALL.quant_shape(mine) == [out, inp]
    with pytest.raises(RuntimeError, match="shapes do not match"):
        SMALL.linear(_x(1, inp, seed=0), mine, out + 1)


# ---- which module runs the integer path ----

def _choose(flags: set[str], forced: str | None = None, avx512: bool = True, vnni256: bool = True,
            asked: list | None = None) -> str | None:
    asked = [] if asked is None else asked
    return kernels.choose_i8_isa(flags, forced, lambda: asked.append("avx512") or avx512,
                                 lambda: asked.append("vnni256") or vnni256)


def test_choice_follows_the_cpu_flags():
    asked: list = []
    assert _choose({"avx512_vnni", "avx_vnni"}, asked=asked) == "avx512-vnni"
    assert asked == ["avx512"]  # the 256-bit module is not built where it is not needed
    assert _choose({"avx512_vnni"}) == "avx512-vnni"  # Zen 4: no AVX-VNNI
    assert _choose({"avx_vnni", "avx2"}) == "avx-vnni"  # Alder Lake and later client cores
    assert _choose({"avx2", "fma"}) is None  # no VNNI: the bf16 path or dense
    # AVX-512-VNNI where the AVX-512 module does not run (no AVX-512-BF16: Ice Lake)
    assert _choose({"avx512_vnni"}, avx512=False) is None
    assert _choose({"avx512_vnni", "avx_vnni"}, avx512=False) == "avx-vnni"
    assert _choose({"avx_vnni"}, vnni256=False) is None  # the 256-bit module did not build
    assert _choose({"avx512_vnni", "avx_vnni"}, forced="avx-vnni") == "avx-vnni"
    assert _choose({"avx_vnni"}, forced="avx512-vnni") is None


def test_environment_forces_the_choice(monkeypatch):
    monkeypatch.setenv("VERISPEC_I8_ISA", "avx2")
    with pytest.raises(ValueError, match="VERISPEC_I8_ISA='avx2'"):
        kernels.i8_isa()
    monkeypatch.setenv("VERISPEC_I8_ISA", "avx-vnni")
    assert not kernels.available() and kernels.isa() is None  # acts as a CPU without AVX-512
    monkeypatch.setenv("VERISPEC_NO_VNNI", "1")
    assert kernels.i8_isa() is None and kernels.quant_i8_types() == frozenset()
    assert loading.auto_quant_kind() is None  # neither kernel path: dense


def test_the_module_falls_back_with_one_warning(monkeypatch, tmp_path):
    from verispec.kernels import build

    monkeypatch.delenv("VERISPEC_NO_KERNELS", raising=False)  # that switch returns before any check
    monkeypatch.setattr(build, "cpu_flags", lambda: {"avx2", "fma"})
    with pytest.warns(UserWarning, match=r"AVX-VNNI integer path is off \(CPU lacks f16c, avx_vnni\)"):
        assert build.build_vnni256() is None
    monkeypatch.setattr(build, "cpu_flags", lambda: set(build.VNNI256_REQUIRED))
    monkeypatch.setattr(build, "_VNNI256_FLAGS", ["-mno-such-option"])
    monkeypatch.setattr(build, "build_dir", lambda module="": tmp_path)
    with pytest.warns(UserWarning, match=r"AVX-VNNI integer path is off \(build failed: .*\); GGUF files"):
        assert build.build_vnni256() is None


@pytest.fixture
def forced_vnni256(monkeypatch):
    """This process as a CPU with AVX-VNNI and no AVX-512 (and no native bf16)."""
    if SMALL is None:
        pytest.skip("no AVX-VNNI module on this CPU")
    monkeypatch.setenv("VERISPEC_I8_ISA", "avx-vnni")
    monkeypatch.setattr(loading, "cpu_has_bf16", lambda: False)
    assert kernels.i8_isa() == "avx-vnni"


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    """A tiny Q4_K_M file (Q5_0 embedding) and one in the default model's formats
    (Q4_1 layers, Q8_0 embedding and head), both with odd vocabularies."""
    folder = tmp_path_factory.mktemp("vnni256")
    legacy = {k: Q.Q4_1 for k in ("q", "k", "v", "o", "gate", "up", "down")} | {"embed": Q.Q8_0, "head": Q.Q8_0}
    shape = TinyShape(vocab=VOCAB, hidden=64, intermediate=160, layers=3, context=512)
    return [write_tiny_kquant(folder / "kquant.gguf", VOCAB),
            write_tiny_gguf(folder / "legacy.gguf", legacy, shape, seed=3, eos=None)]


def test_auto_takes_the_256_bit_module_and_says_so(forced_vnni256, tiny_files):
    loaded = loading.load_target(str(tiny_files[1]), weights="auto")
    target = loaded.target
    assert loaded.weights == "quant-i8" and target.dtype == torch.bfloat16  # bf16 although "no native bf16"
    assert not target.row_kernels and not target._fused  # the eager forward, with the integer Linear
    assert kernels.is_int8(target.weights.lm_head.weight)
    result = Engine(target, tokenizer=CharTokenizer()).generate([3, 4], SamplingParams(max_new_tokens=2))
    assert "weights=quant-i8/avx-vnni" in result.stats.format_line()
    with pytest.raises(ValueError, match="--weights quant: verispec's CPU kernels are off"):
        loading.load_target(str(tiny_files[1]), dtype="bf16", weights="quant")


def test_no_vnni_falls_back_to_dense(forced_vnni256, tiny_files, monkeypatch):
    monkeypatch.setenv("VERISPEC_NO_VNNI", "1")
    with pytest.raises(ValueError, match="needs AVX-512-VNNI or AVX-VNNI"):
        loading.load_target(str(tiny_files[1]), weights="quant-i8")
    # auto: no kernel path takes the file (load_target then dequantizes it to dense)
    assert loading._load_quant(tiny_files[1], "auto", "auto", "bf16", None, False) is None


SPECS = [SpecConfig(proposer="ngram", k=4), SpecConfig(proposer="ngram", k=8, tree=12),
         SpecConfig(proposer="draft", draft="self:1", k=3), SpecConfig(proposer="draft", draft="same", k=6)]
PROMPTS = [[3, 17, 4, 9, 3, 17, 4], [42], list(range(10, 40)), [7, 7, 7, 7, 8, 7, 7, 7]]


@pytest.mark.parametrize("which", ["kquant", "legacy"])
def test_greedy_speculation_equals_plain(forced_vnni256, tiny_files, which):
    """The law on the 256-bit path: token-identical, no near-tie excused (row-invariant
    by construction: the integer Linear, and the eager forward's row-by-row attention)."""
    target = loading.load_target(str(tiny_files[0 if which == "kquant" else 1]), weights="quant-i8").target
    engine = Engine(target, tokenizer=CharTokenizer())
    engine._drafts["same"] = target
    greedy = SamplingParams(max_new_tokens=24)
    for prompt in PROMPTS:
        plain = engine.generate(prompt, greedy, SpecConfig(proposer="none", k=0)).token_ids
        for spec in SPECS:
            got = engine.generate(prompt, greedy, spec)
            assert got.token_ids == plain, (prompt, spec)
            if spec.draft == "same":
                assert got.stats.accepted == got.stats.drafted > 0
