"""Gemma 2 and Gemma 3 on the native kernels: the fused C++ layer (kernels/
gemma_layer.cpp) computes what the op-by-op path does, the attention kernel
takes Gemma's scale and soft-cap, and every row of a tree or a batch of
requests has the bits it has fed alone, as a chain."""
from __future__ import annotations

import pytest
import torch
from test_native import _check_batch_invariance, _max_diff, _tokens
from test_native_batch import _without_kernels, fused_against_ops
from test_native_window import _native

from verispec import kernels
from verispec.models.base import BatchItem

pytestmark = pytest.mark.skipif(not kernels.available(), reason="verispec kernels unavailable")
GEMMAS = ["gemma2", "gemma3"]


@pytest.mark.parametrize("kind", GEMMAS)
def test_fused_gemma_layer_matches_layer_by_ops(tmp_path, kind):
    """One C++ call a layer against the kernels op by op: equal up to summation
    order and tanh/rsqrt ulps (here they agree bit for bit). Against float32, the
    fused bf16 model is as close as the PyTorch bf16 path (transformers' op order)."""
    native = _native(tmp_path, kind, torch.bfloat16)
    assert native._fused and all(args is not None for args in native._fused_args)
    tokens = _tokens(40, vocab=native.vocab_size)
    layers = tuple(range(native.num_layers + 1))
    fused = fused_against_ops(native, tokens)
    fp32 = _native(tmp_path, kind, torch.float32)
    truth = fp32.forward(tokens, fp32.new_cache(), hidden_layers=layers)
    pytorch = _without_kernels(_native(tmp_path, kind, torch.bfloat16))
    plain = pytorch.forward(tokens, pytorch.new_cache(), hidden_layers=layers)
    for a, b, t in zip(fused.hidden + (fused.logits,), plain.hidden + (plain.logits,),
                       truth.hidden + (truth.logits,)):
        assert _max_diff(a.float(), t) <= 1.5 * _max_diff(b.float(), t) + 0.01
    _check_batch_invariance(native, context=20, max_block=6)


def _tree_rows(native, prefix: torch.Tensor, cache):
    """A 5-node tree after `prefix`: roots a, b; a's children c, d; c's child e.
    Returns (tokens, positions, mask, paths), paths[i] = node i's tokens root first."""
    parents = [-1, -1, 0, 0, 2]
    tokens = _tokens(5, seed=9, vocab=native.vocab_size)
    start = prefix.shape[0]
    mask = torch.zeros(5, start + 5, dtype=torch.bool)
    mask[:, :start] = True
    paths, depth = [], []
    for i, parent in enumerate(parents):
        chain = [i] if parent < 0 else paths[parent] + [i]
        paths.append(chain)
        depth.append(len(chain) - 1)
        mask[i, [start + j for j in chain]] = True
    return tokens, torch.tensor(depth) + start, mask, [tokens[p] for p in paths]


@pytest.mark.parametrize("kind", GEMMAS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_tree_and_batch_rows_equal_their_chains(tmp_path, kind, dtype):
    """Past the window (a prefix of 30 against a window of 8): each tree node's
    logits equal its path fed as a chain, alone and inside a batch of requests."""
    native = _native(tmp_path, kind, dtype)
    assert native.fuses_batches
    prefix = _tokens(30, seed=3, vocab=native.vocab_size)
    tree_cache = native.new_cache()
    native.forward(prefix, tree_cache)
    tokens, positions, mask, paths = _tree_rows(native, prefix, tree_cache)
    alone = native.forward(tokens, tree_cache, positions=positions, mask=mask).logits
    for i, path in enumerate(paths):
        chain = native.new_cache()
        native.forward(torch.cat((prefix, path)), chain, num_logits=0)
        chain.truncate(30)
        want = native.forward(path, chain).logits[-1]
        assert torch.equal(alone[i], want), f"{kind} node {i}"
    # The same tree beside a decode and a prefill of other requests, in one forward.
    tree_cache.truncate(30)
    other = native.new_cache()
    native.forward(_tokens(12, seed=4, vocab=native.vocab_size), other)
    fresh = native.new_cache()
    decode = _tokens(1, seed=5, vocab=native.vocab_size)
    prefill = _tokens(20, seed=6, vocab=native.vocab_size)
    batched = native.forward_batch([BatchItem(decode, other), BatchItem(prefill, fresh),
                                    BatchItem(tokens, tree_cache, positions, mask)])
    assert torch.equal(batched[2].logits, alone)
    other.truncate(12)
    assert torch.equal(batched[0].logits, native.forward(decode, other).logits)
    assert torch.equal(batched[1].logits, native.forward(prefill, native.new_cache()).logits)


def test_batch_invariant_gemma_needs_the_kernels(tmp_path, monkeypatch):
    """With the kernels, Gemma takes --batch-invariant (fixed fp32 matmul tiles);
    the PyTorch fallback has no fixed-tile attention with Gemma's soft-cap, and says so."""
    native = _native(tmp_path, "gemma2", torch.float32, batch_invariant=True)
    _check_batch_invariance(native, context=20, max_block=6)
    reference = _native(tmp_path, "gemma2", torch.float32)
    tokens = _tokens(30, vocab=native.vocab_size)
    assert _max_diff(native.forward(tokens, native.new_cache()).logits,
                     reference.forward(tokens, reference.new_cache()).logits) < 1e-4
    monkeypatch.setattr(kernels, "available", lambda: False)
    with pytest.raises(ValueError, match="batch-invariant needs verispec's kernels"):
        _native(tmp_path, "gemma2", torch.float32, batch_invariant=True)


@pytest.mark.parametrize("kind", ["gemma2", "gemma3", "phi3"])
def test_quantized_self_draft_is_lossless(tmp_path, kind):
    """quant:FMT on Gemma and Phi-3 (fused q/k/v and gate/up in the checkpoint): the
    target's own layers re-cast to GGUF blocks draft, past the window, losslessly."""
    from test_sliding_window import PROMPT

    from verispec import Engine, SamplingParams, SpecConfig

    native = _native(tmp_path, kind, torch.bfloat16)
    engine = Engine(native)
    draft = engine.load_draft("quant:Q8_0")
    assert type(draft) is type(native) and draft.weights_kind == "quant" and draft._fused
    fixed = SamplingParams(max_new_tokens=30, ignore_eos=True)
    plain = engine.generate(PROMPT, fixed, SpecConfig("none")).token_ids
    for name in ("quant:Q8_0", "quant:Q4_0:2"):
        out = engine.generate(PROMPT, fixed, SpecConfig("draft", draft=name, k=4))
        assert out.token_ids == plain, name
        assert out.stats.accepted > 0
