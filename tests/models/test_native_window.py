"""Sliding-window layers on the native backend (Mistral's and Phi-3's
sliding_window, Qwen2's use_sliding_window from max_window_layers on), past the window: logits
match transformers in fp32, and row invariance holds bit for bit in blocks,
trees and batches, so every proposer's greedy output equals plain decoding."""
from __future__ import annotations

import pytest
import torch
from test_native import _check_batch_invariance, _max_diff, _tokens
from test_native_batch import _batch_items, _solo, _without_kernels
from test_sliding_window import PROMPT, windowed

from verispec import Engine, SamplingParams, SpecConfig, kernels
from verispec.models.gemma import native_class
from verispec.models.hf import HFModel
from verispec.models.llama_weights import read_config

needs_kernels = pytest.mark.skipif(not kernels.available(), reason="verispec kernels unavailable")


def _native(tmp_path, kind: str, dtype=torch.float32, seed: int = 0, **options):
    folder = tmp_path / f"{kind}-{seed}"
    if not folder.exists():
        windowed(kind, seed).save_pretrained(folder)
    return native_class(read_config(folder)).from_dir(folder, dtype, **options)


@pytest.mark.parametrize("kind", ["mistral", "qwen2", "phi3", "gemma2", "gemma3"])
def test_window_layers_and_logits_match_transformers(tmp_path, kind):
    native = _native(tmp_path, kind)
    assert native.spec.sliding_window == 8 and native.max_context == 512
    layers = {"qwen2": (False, False, True, True), "gemma2": (True, False, True, False),
              "gemma3": (True, True, False, True)}
    assert native.spec.sliding_layers == layers.get(kind, (True,) * 4)
    hf = HFModel(windowed(kind, 0))
    tokens = _tokens(60, vocab=native.vocab_size)
    hc, nc = hf.new_cache(), native.new_cache()
    assert _max_diff(hf.forward(tokens[:30], hc).logits, native.forward(tokens[:30], nc).logits) < 1e-4
    for n, keep in [(1, 1), (5, 2), (4, 4), (6, 1)]:  # blocks and rollbacks past the window
        start = nc.length
        a = hf.forward(tokens[start:start + n], hc)
        b = native.forward(tokens[start:start + n], nc)
        assert _max_diff(a.logits, b.logits) < 1e-4
        hc.truncate(start + keep)
        nc.truncate(start + keep)


@needs_kernels
@pytest.mark.parametrize("kind", ["mistral", "qwen2", "phi3", "gemma2", "gemma3"])
@pytest.mark.parametrize("dtype, invariant", [(torch.bfloat16, False), (torch.float32, True)])
def test_blocks_and_batches_past_the_window_are_bit_exact(tmp_path, kind, dtype, invariant):
    native = _native(tmp_path, kind, dtype, batch_invariant=invariant)
    # Gemma too: one fused forward over every request (and one C++ call a layer in bf16).
    assert native.fuses_batches and native._fused == (dtype == torch.bfloat16)
    _check_batch_invariance(native, context=20, max_block=6)
    items, contexts = _batch_items(native)  # contexts 0, 30, 17, 9 against a window of 8
    batched = native.forward_batch(items)
    for b, s in zip(batched, _solo(native, items, contexts)):
        assert torch.equal(b.logits, s.logits)


@pytest.mark.parametrize("kind", ["mistral", "qwen2", "phi3", "gemma2", "gemma3"])
def test_without_kernels_the_window_holds(tmp_path, kind):
    native = _without_kernels(_native(tmp_path, kind))
    reference = _native(tmp_path, kind)
    tokens = _tokens(40, vocab=native.vocab_size)
    a = native.forward(tokens, native.new_cache()).logits
    b = reference.forward(tokens, reference.new_cache()).logits
    assert _max_diff(a, b) < 1e-4
    # The bounded (window or mixed) cache on this path too, through shifts and a rollback.
    native.window_block = 16
    tokens = _tokens(100, seed=2, vocab=native.vocab_size)
    bounded, whole = native.new_cache(200), reference.new_cache(200)
    assert type(bounded).__name__ in ("WindowKVCache", "MixedKVCache")
    assert _max_diff(native.forward(tokens[:90], bounded).logits,
                     reference.forward(tokens[:90], whole).logits) < 1e-4
    for cache in (bounded, whole):
        cache.truncate(86)
    assert _max_diff(native.forward(tokens[86:], bounded).logits,
                     reference.forward(tokens[86:], whole).logits) < 1e-4


@needs_kernels
@pytest.mark.parametrize("kind", ["mistral", "qwen2", "phi3", "gemma2", "gemma3"])
def test_every_proposer_equals_plain_native_bf16(tmp_path, kind):
    native = _native(tmp_path, kind, torch.bfloat16)
    engine = Engine(native)
    engine._drafts["random"] = _native(tmp_path, kind, torch.bfloat16, seed=1)
    fixed = SamplingParams(max_new_tokens=40, ignore_eos=True)
    plain = engine.generate(PROMPT, fixed, SpecConfig("none")).token_ids
    drafted = accepted = 0
    for spec in (SpecConfig("ngram", k=4), SpecConfig("draft", draft="self:2", k=4),
                 SpecConfig("draft", draft="random", k=5),
                 SpecConfig("draft", draft="self:2", k=4, tree=12, tree_shape="topb",
                            tree_branch=3)):
        out = engine.generate(PROMPT, fixed, spec)
        assert out.token_ids == plain, spec
        drafted, accepted = drafted + out.stats.drafted, accepted + out.stats.accepted
    assert drafted > accepted  # rejected drafts rolled back past the window


@needs_kernels
@pytest.mark.parametrize("kind, dtype", [(kind, torch.bfloat16) for kind in
                                         ("mistral", "phi3", "qwen2", "gemma2", "gemma3")]
                         + [("phi3", torch.float32), ("gemma2", torch.float32)])
def test_bounded_window_cache_gives_the_same_bits(tmp_path, kind, dtype):
    """The sliding layers' cache holds window - 1 + 2 * block positions and shifts
    (every layer of Mistral and Phi-3; the local layers of Qwen2, Gemma 2 and 3, whose
    global layers keep all), yet plain decoding and every proposer give the bits of
    the full cache, past the window and through rollbacks."""
    full = _native(tmp_path, kind, dtype)
    bounded = _native(tmp_path, kind, dtype)
    bounded.window_block = 16
    cache = bounded.new_cache(200)
    local = 8 - 1 + 32
    if kind in ("mistral", "phi3"):
        assert type(cache).__name__ == "WindowKVCache" and cache.kv.shape[3] == local
        shifted = cache
    else:
        assert type(cache).__name__ == "MixedKVCache" and cache.local.kv.shape[3] == local
        assert [kv.shape[2] for kv in cache.kv] == [local if s else 200 for s in bounded._sliding]
        assert cache.full.kv.shape[0] == bounded._sliding.count(False)  # no full buffer for local layers
        shifted = cache.local
    assert type(full.new_cache(200)).__name__ == "StaticKVCache"
    tokens = _tokens(120, vocab=full.vocab_size)
    want = full.forward(tokens, full.new_cache(200)).logits
    got = bounded.forward(tokens, cache).logits  # a prefill in pieces, shifting
    assert shifted.offset > 0 and cache.length == 120
    assert torch.equal(got, want) if dtype == torch.bfloat16 else _max_diff(got, want) < 1e-4
    with pytest.raises(ValueError, match="cannot roll a sliding-window cache back"):
        cache.truncate(shifted.offset + 3)
    assert cache.length == 120  # a refused rollback changes nothing
    fixed = SamplingParams(max_new_tokens=60, ignore_eos=True)
    plain = Engine(full).generate(PROMPT, fixed, SpecConfig("none")).token_ids
    engine = Engine(bounded)
    draft = _native(tmp_path, kind, dtype, seed=1)
    draft.window_block = 16
    engine._drafts["random"] = draft
    layer_skip = engine.load_draft("self:2")  # Qwen2's first two layers attend to everything
    assert (type(layer_skip.new_cache(200)).__name__ == "StaticKVCache") == (not layer_skip._sliding)
    for spec in (SpecConfig("none"), SpecConfig("ngram", k=4),
                 SpecConfig("draft", draft="self:2", k=4), SpecConfig("draft", draft="random", k=5),
                 SpecConfig("draft", draft="self:2", k=4, tree=12, tree_shape="topb",
                            tree_branch=3)):
        assert engine.generate(PROMPT, fixed, spec).token_ids == plain, spec


@needs_kernels
@pytest.mark.parametrize("kind", ["mistral", "gemma3"])
def test_batch_over_shifted_window_caches_equals_each_alone(tmp_path, kind):
    from verispec.models.base import BatchItem

    native = _native(tmp_path, kind, torch.bfloat16)
    native.window_block = 16
    contexts = [40, 50, 45]
    caches = []
    for i, length in enumerate(contexts):
        cache = native.new_cache(200)
        native.forward(_tokens(length, seed=20 + i, vocab=native.vocab_size), cache)
        assert getattr(cache, "local", cache).offset > 0  # shifted: slots no longer equal positions
        caches.append(cache)
    start = contexts[2]
    mask = torch.zeros(3, start + 3, dtype=torch.bool)
    mask[:, :start] = True
    mask[0, start] = mask[1, start + 1] = mask[2, start] = mask[2, start + 2] = True
    items = [BatchItem(_tokens(1, seed=1, vocab=native.vocab_size), caches[0]),
             BatchItem(_tokens(5, seed=2, vocab=native.vocab_size), caches[1]),
             BatchItem(_tokens(3, seed=3, vocab=native.vocab_size), caches[2],
                       positions=torch.tensor([start, start, start + 1]), mask=mask)]
    batched = native.forward_batch(items)
    for b, s in zip(batched, _solo(native, items, contexts)):
        assert torch.equal(b.logits, s.logits)
