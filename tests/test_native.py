"""The native Llama-family backend against transformers, plus its cache and
batch-invariant mode. Tiny random models keep the fast tests in seconds."""
from __future__ import annotations

import json

import pytest
import torch

from verispec.kv_cache import StaticKVCache
from verispec.models.hf import HFModel
from verispec.models.llama import NativeLlama

TOL = 1e-4
# 30 layers of fp32: verispec's attention kernel sums each row in another order than
# SDPA (1.22e-4 measured on the AMD EPYC CI with the kernels on).
DEFAULT_TOL = 2e-4
VOCAB = 101


def _tiny_config(kind: str):
    import transformers

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  tie_word_embeddings=False)
    if kind == "llama":
        return transformers.LlamaConfig(**common)
    if kind == "llama-tied-mha":
        return transformers.LlamaConfig(**{**common, "num_key_value_heads": 4,
                                           "tie_word_embeddings": True})
    if kind == "llama3-rope":
        return transformers.LlamaConfig(**common, rope_parameters={
            "rope_type": "llama3", "rope_theta": 50000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 32})
    if kind == "mistral":
        return transformers.MistralConfig(**common, sliding_window=None)
    if kind == "qwen2":
        return transformers.Qwen2Config(**common)
    if kind == "qwen3":
        return transformers.Qwen3Config(**common, head_dim=16)
    raise ValueError(kind)


def _tiny_pair(tmp_path, kind: str, dtype=torch.float32, batch_invariant=False):
    """A seeded random HF model saved to disk, and the native model loaded from it."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(_tiny_config(kind)).eval()
    with torch.no_grad():  # random biases and norm weights, so a dropped one shows
        for name, param in hf.named_parameters():
            if name.endswith("bias") or "norm" in name:
                param.normal_(1.0 if "norm" in name else 0.0, 0.2)
    hf.save_pretrained(tmp_path)
    hf = hf.to(dtype)
    native = NativeLlama.from_dir(tmp_path, dtype, batch_invariant=batch_invariant)
    return HFModel(hf), native


def _tokens(n: int, seed: int = 1, vocab: int = VOCAB) -> torch.Tensor:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


@pytest.mark.parametrize("kind", ["llama", "llama-tied-mha", "llama3-rope", "mistral",
                                  "qwen2", "qwen3"])
def test_logits_and_hidden_match_hf_fp32(tmp_path, kind):
    hf, native = _tiny_pair(tmp_path, kind)
    assert native.num_layers == hf.num_layers and native.vocab_size == hf.vocab_size
    tokens = _tokens(40)
    hc, nc = hf.new_cache(), native.new_cache()
    layers = tuple(range(native.num_layers + 1))
    a = hf.forward(tokens[:12], hc, hidden_layers=layers)
    b = native.forward(tokens[:12], nc, hidden_layers=layers)
    assert _max_diff(a.logits, b.logits) < TOL
    assert len(b.hidden) == len(layers)
    for ha, hb in zip(a.hidden, b.hidden):  # index for index, the last one after the final norm
        assert ha.shape == hb.shape and _max_diff(ha, hb) < TOL
    # Incremental steps of mixed sizes, with rollbacks like rejected drafts.
    pos = 12
    for n, keep in [(1, 1), (4, 2), (3, 3), (5, 1), (1, 1), (6, 4)]:
        a = hf.forward(tokens[pos:pos + n], hc, num_logits=n)
        b = native.forward(tokens[pos:pos + n], nc, num_logits=n)
        assert b.logits.dtype == torch.float32 and b.logits.shape == (n, VOCAB)
        assert _max_diff(a.logits, b.logits) < TOL
        pos += keep
        hc.truncate(pos)
        nc.truncate(pos)
        assert nc.length == hc.length == pos


def test_num_logits_and_weights_fingerprint(tmp_path):
    hf, native = _tiny_pair(tmp_path, "llama")
    tokens = _tokens(10)
    full = native.forward(tokens, native.new_cache()).logits
    last = native.forward(tokens, native.new_cache(), num_logits=3).logits
    none = native.forward(tokens, native.new_cache(), num_logits=0).logits
    assert full.shape == (10, VOCAB) and none.shape == (0, VOCAB)
    assert _max_diff(full[-3:], last) == 0
    assert native.weights_fingerprint() == hf.weights_fingerprint()
    assert native.truncated(2).weights_fingerprint() == hf.truncated(2).weights_fingerprint()


def test_truncated_matches_hf_truncated(tmp_path):
    hf, native = _tiny_pair(tmp_path, "qwen2")
    tokens = _tokens(16)
    hf2, native2 = hf.truncated(2), native.truncated(2)
    assert native2.num_layers == 2 and native.num_layers == 3
    a = hf2.forward(tokens, hf2.new_cache(), hidden_layers=(0, 2))
    b = native2.forward(tokens, native2.new_cache(), hidden_layers=(0, 2))
    assert _max_diff(a.logits, b.logits) < TOL
    assert all(_max_diff(x, y) < TOL for x, y in zip(a.hidden, b.hidden))
    with pytest.raises(ValueError):
        native.truncated(4)


def test_supports_and_eos(tmp_path):
    _, native = _tiny_pair(tmp_path, "llama")
    config = json.loads((tmp_path / "config.json").read_text())
    assert NativeLlama.supports(config)
    assert not NativeLlama.supports({**config, "model_type": "gpt2"})
    assert not NativeLlama.supports({**config, "rope_parameters": {"rope_type": "yarn",
                                                                   "rope_theta": 1e4}})
    assert native.eos_token_ids == frozenset({config["eos_token_id"]})
    assert native.max_context == 256


def test_truncate_then_reforward_equals_fresh(tmp_path):
    _, native = _tiny_pair(tmp_path, "llama")
    tokens, other = _tokens(20), _tokens(6, seed=7)
    cache = native.new_cache()
    native.forward(tokens[:10], cache)
    native.forward(other, cache)  # a rejected draft
    cache.truncate(10)
    cache.truncate(50)  # no-op past the end
    assert cache.length == 10
    resumed = native.forward(tokens[10:20], cache).logits
    fresh = native.forward(tokens, native.new_cache()).logits[10:]
    assert _max_diff(resumed, fresh) < 1e-6


def test_compact_equals_chain_of_kept_tokens(tmp_path):
    _, native = _tiny_pair(tmp_path, "llama")
    prefix, block = _tokens(8), _tokens(6, seed=3)
    keep = torch.tensor([9, 11, 13])  # absolute cache indices of the accepted nodes
    kept_tokens = block[keep - 8]
    cache = native.new_cache()
    native.forward(prefix, cache)
    # The kept tokens sit at positions 8, 9, 10 of the accepted path, as a tree would place them.
    positions = torch.tensor([8, 8, 9, 9, 10, 10])
    positions[keep - 8] = torch.tensor([8, 9, 10])
    mask = torch.ones(6, 14, dtype=torch.bool)
    mask[:, 8:] = torch.eye(6, dtype=torch.bool)
    mask[3, 9] = mask[5, 9] = mask[5, 11] = True  # each kept node sees its kept ancestors
    native.forward(block, cache, positions=positions, mask=mask)
    cache.compact(8, keep)
    assert cache.length == 11
    chain = native.new_cache()
    native.forward(torch.cat((prefix, kept_tokens)), chain)
    assert torch.equal(cache.kv[:, :, :, :11], chain.kv[:, :, :, :11])
    nxt = _tokens(2, seed=5)
    assert _max_diff(native.forward(nxt, cache).logits, native.forward(nxt, chain).logits) < 1e-6
    with pytest.raises(ValueError):
        cache.compact(8, torch.tensor([10, 9]))
    with pytest.raises(ValueError):
        cache.compact(8, torch.tensor([7]))


def test_capacity_overflow_raises_and_leaves_cache_intact(tmp_path):
    _, native = _tiny_pair(tmp_path, "llama")
    cache = native.new_cache(capacity=16)
    native.forward(_tokens(10), cache)
    with pytest.raises(ValueError, match="capacity"):
        native.forward(_tokens(7), cache)
    assert cache.length == 10
    native.forward(_tokens(6), cache)
    assert cache.length == 16
    with pytest.raises(ValueError, match="max_context"):
        native.new_cache(capacity=native.max_context + 1)
    assert StaticKVCache(1, 1, 4, 10, torch.float32, align=8).kv.shape[3] == 16


def test_tree_mask_matches_separate_chains(tmp_path):
    """Two branches sharing a prefix, in one forward, give each branch's chain logits."""
    _, native = _tiny_pair(tmp_path, "llama")
    prefix, left, right = _tokens(9), _tokens(3, seed=2), _tokens(2, seed=3)
    cache = native.new_cache()
    native.forward(prefix, cache)
    start = cache.length
    block = torch.cat((left, right))
    positions = torch.tensor([9, 10, 11, 9, 10])
    mask = torch.zeros(5, start + 5, dtype=torch.bool)
    mask[:, :start] = True
    mask[:3, start:start + 3] = torch.tril(torch.ones(3, 3, dtype=torch.bool))
    mask[3:, start + 3:] = torch.tril(torch.ones(2, 2, dtype=torch.bool))
    tree = native.forward(block, cache, positions=positions, mask=mask).logits
    for rows, branch in ((slice(0, 3), left), (slice(3, 5), right)):
        chain = native.forward(torch.cat((prefix, branch)), native.new_cache()).logits[start:]
        assert _max_diff(tree[rows], chain) < 1e-5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_batch_invariant_tiny(tmp_path, dtype):
    _, native = _tiny_pair(tmp_path, "qwen3", dtype=dtype, batch_invariant=True)
    # 140 > INVARIANT_SLICE: the prefill runs as slices and must still match.
    _check_batch_invariance(native, context=140, max_block=8)


def test_batch_invariant_tree_matches_chain(tmp_path):
    _, native = _tiny_pair(tmp_path, "llama", dtype=torch.bfloat16, batch_invariant=True)
    prefix, left, right = _tokens(9), _tokens(3, seed=2), _tokens(2, seed=3)
    cache = native.new_cache()
    native.forward(prefix, cache)
    mask = torch.zeros(5, 14, dtype=torch.bool)
    mask[:, :9] = True
    mask[:3, 9:12] = torch.tril(torch.ones(3, 3, dtype=torch.bool))
    mask[3:, 12:] = torch.tril(torch.ones(2, 2, dtype=torch.bool))
    tree = native.forward(torch.cat((left, right)), cache, positions=torch.tensor([9, 10, 11, 9, 10]),
                          mask=mask).logits
    for rows, branch in ((slice(0, 3), left), (slice(3, 5), right)):
        chain = native.new_cache()
        native.forward(prefix, chain)
        one_by_one = torch.stack([native.forward(t[None], chain).logits[0] for t in branch])
        assert torch.equal(tree[rows], one_by_one)


def _check_batch_invariance(native: NativeLlama, context: int, max_block: int) -> None:
    """Logits of position i inside a block of n equal those of plain one-token decode, bit
    for bit, and so does the cache the block leaves behind (prefill included)."""
    tokens = _tokens(context + max_block + 1, vocab=native.vocab_size)
    chain = native.new_cache()
    singles = torch.stack([native.forward(t[None], chain).logits[0] for t in tokens])
    prefilled = native.new_cache()
    assert torch.equal(native.forward(tokens[:context], prefilled).logits, singles[:context])
    assert torch.equal(prefilled.kv[:, :, :, :context], chain.kv[:, :, :, :context])
    for n in range(1, max_block + 1):
        prefilled.truncate(context)
        block = native.forward(tokens[context:context + n], prefilled).logits
        assert torch.equal(block, singles[context:context + n]), f"block of {n}"
        after = native.forward(tokens[context + n:context + n + 1], prefilled).logits[0]
        assert torch.equal(after, singles[context + n]), f"decode after a block of {n}"


def _default_model_dir():
    from verispec.models.loading import resolve_model_dir

    try:
        return resolve_model_dir(None)
    except ValueError as err:
        pytest.skip(str(err))


def test_default_model_matches_hf_fp32(default_model):
    from verispec.models.loading import load_hf

    folder = _default_model_dir()
    native = NativeLlama.from_dir(folder, torch.float32)
    hf = HFModel(load_hf(None, "fp32").model)
    tokens = _tokens(300, vocab=native.vocab_size)
    hc, nc = hf.new_cache(), native.new_cache()
    layers = (0, 15, native.num_layers)
    a = hf.forward(tokens[:200], hc, hidden_layers=layers)
    b = native.forward(tokens[:200], nc, hidden_layers=layers)
    assert _max_diff(a.logits, b.logits) < DEFAULT_TOL
    for ha, hb in zip(a.hidden, b.hidden):
        assert _max_diff(ha, hb) < TOL * max(1.0, ha.abs().max().item() / 10)
    pos = 200
    while pos < 300:
        n = min(5, 300 - pos)
        a = hf.forward(tokens[pos:pos + n], hc)
        b = native.forward(tokens[pos:pos + n], nc)
        assert _max_diff(a.logits, b.logits) < DEFAULT_TOL
        pos += 3 if n == 5 else n
        hc.truncate(pos)
        nc.truncate(pos)


def test_default_model_batch_invariant_bf16(default_model):
    native = NativeLlama.from_dir(_default_model_dir(), torch.bfloat16, batch_invariant=True)
    _check_batch_invariance(native, context=60, max_block=8)
