"""The native backend's fused paths: several requests in one forward
(`forward_batch`), the one-call bf16 decoder layer, and the pure-PyTorch fallback
used where verispec's kernels are unavailable."""
from __future__ import annotations

import pytest
import torch
from test_native import _check_batch_invariance, _max_diff, _tiny_pair, _tokens

from verispec import kernels
from verispec.models.base import BatchItem
from verispec.models.llama import NativeLlama, _fused_weights

needs_kernels = pytest.mark.skipif(not kernels.available(), reason="verispec kernels unavailable")


def _without_kernels(native: NativeLlama) -> NativeLlama:
    """The same model on the SDPA/PyTorch paths a CPU without AVX-512/AMX takes."""
    native.row_kernels = False
    native._fused = False
    return native


def _batch_items(native: NativeLlama, seed: int = 0) -> tuple[list[BatchItem], list]:
    """Four requests at different cache lengths: a long prefill, a one-token decode,
    a verification block and a token tree, with per-item logits and hidden states."""
    vocab = native.vocab_size
    contexts = [0, 30, 17, 9]
    caches = []
    for i, length in enumerate(contexts):
        cache = native.new_cache()
        if length:
            native.forward(_tokens(length, seed=seed + 10 + i, vocab=vocab), cache)
        caches.append(cache)
    mask = torch.zeros(3, 12, dtype=torch.bool)
    mask[:, :9] = True
    mask[0, 9] = mask[1, 10] = mask[2, 9] = mask[2, 11] = True  # node 2 is node 0's child
    items = [
        BatchItem(_tokens(25, seed=seed + 1, vocab=vocab), caches[0], num_logits=1),
        BatchItem(_tokens(1, seed=seed + 2, vocab=vocab), caches[1], hidden_layers=(0, 2)),
        BatchItem(_tokens(5, seed=seed + 3, vocab=vocab), caches[2], num_logits=None,
                  hidden_layers=(native.num_layers,)),
        BatchItem(_tokens(3, seed=seed + 4, vocab=vocab), caches[3],
                  positions=torch.tensor([9, 9, 10]), mask=mask),
    ]
    return items, contexts


def _solo(native: NativeLlama, items: list[BatchItem], contexts: list[int]):
    outs = []
    for item, length in zip(items, contexts):
        item.cache.truncate(length)
        outs.append(native.forward(item.tokens, item.cache, item.positions, item.mask,
                                   item.num_logits, item.hidden_layers))
    return outs


@needs_kernels
@pytest.mark.parametrize("dtype, invariant", [(torch.bfloat16, False), (torch.float32, True)])
def test_batch_of_ragged_requests_equals_each_alone(tmp_path, dtype, invariant):
    _, native = _tiny_pair(tmp_path, "qwen3", dtype=dtype, batch_invariant=invariant)
    items, contexts = _batch_items(native)
    batched = native.forward_batch(items)
    lengths = [item.cache.length for item in items]
    snapshot = [item.cache.kv[:, :, :, :n].clone() for item, n in zip(items, lengths)]
    solo = _solo(native, items, contexts)
    for b, s, item, kv, n in zip(batched, solo, items, snapshot, lengths):
        assert torch.equal(b.logits, s.logits)
        assert len(b.hidden) == len(item.hidden_layers)
        assert all(torch.equal(x, y) for x, y in zip(b.hidden, s.hidden))
        assert item.cache.length == n and torch.equal(item.cache.kv[:, :, :, :n], kv)
    assert [b.logits.shape[0] for b in batched] == [1, 1, 5, 3]


@needs_kernels
def test_batch_fp32_default_is_close_to_each_alone(tmp_path):
    """Without batch_invariant, fp32 matmuls may round differently at another row
    count: still within float32 noise."""
    _, native = _tiny_pair(tmp_path, "llama")
    items, contexts = _batch_items(native, seed=5)
    batched = native.forward_batch(items)
    for b, s in zip(batched, _solo(native, items, contexts)):
        assert _max_diff(b.logits, s.logits) < 1e-4


def test_batch_without_kernels_runs_items_in_turn(tmp_path):
    _, native = _tiny_pair(tmp_path, "llama")
    native = _without_kernels(native)
    items, contexts = _batch_items(native, seed=7)
    batched = native.forward_batch(items)
    for b, s in zip(batched, _solo(native, items, contexts)):
        assert torch.equal(b.logits, s.logits)


@needs_kernels
def test_batch_errors_leave_every_cache_as_it_was(tmp_path):
    _, native = _tiny_pair(tmp_path, "llama")
    items, contexts = _batch_items(native)
    items[2] = BatchItem(items[2].tokens, native.new_cache(capacity=3))  # overflows
    with pytest.raises(ValueError, match="capacity"):
        native.forward_batch(items)
    assert [item.cache.length for item in items] == [0, 30, 0, 9]
    with pytest.raises(ValueError, match="own cache"):
        native.forward_batch([items[1], items[1]])


def fused_against_ops(native: NativeLlama, tokens: torch.Tensor):
    """The fused bf16 forward of `tokens` (every hidden layer kept), checked against
    the op-by-op forward: equal up to summation order, a bf16 unit here and there."""
    layers = tuple(range(native.num_layers + 1))
    fused = native.forward(tokens, native.new_cache(), hidden_layers=layers)
    native._fused = False
    try:
        by_ops = native.forward(tokens, native.new_cache(), hidden_layers=layers)
    finally:
        native._fused = True
    for a, b in zip(fused.hidden, by_ops.hidden):
        assert ((a.float() - b.float()).abs() <= 2.0 ** -6 * b.float().abs() + 0.02).all()
    assert (fused.logits - by_ops.logits).abs().max() < 0.1
    return fused

@needs_kernels
@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_fused_layer_matches_layer_by_ops(tmp_path, kind):
    """The one-call bf16 layer computes what the op-by-op path computes, up to
    summation order (a bf16 unit here and there), and is itself exact under blocks."""
    _, native = _tiny_pair(tmp_path, kind, dtype=torch.bfloat16)
    assert native._fused
    fused_against_ops(native, _tokens(40, vocab=native.vocab_size))
    _check_batch_invariance(native, context=20, max_block=6)
    assert len(_fused_weights(native.layers[0])) == 8


def test_fallback_paths_match_hf_and_stay_exact(tmp_path):
    """Where the kernels are unavailable: fp32 logits still match transformers, and
    batch-invariant bf16 still equals plain decoding bit for bit."""
    hf, native = _tiny_pair(tmp_path, "qwen2")
    native = _without_kernels(native)
    tokens = _tokens(30)
    a = hf.forward(tokens, hf.new_cache())
    b = native.forward(tokens, native.new_cache())
    assert _max_diff(a.logits, b.logits) < 1e-4
    invariant = _without_kernels(NativeLlama.from_dir(tmp_path, torch.bfloat16, batch_invariant=True))
    _check_batch_invariance(invariant, context=140, max_block=8)
