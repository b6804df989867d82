"""Sliding-window models on the HF backend, on prompts longer than the window:
every proposer's greedy output equals transformers' own greedy `generate`.
Before `hf_cache.WindowLayer`, the first rejected draft past the window died in
transformers' crop ("does not track past states")."""
from __future__ import annotations

import pytest
import torch
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from verispec import Engine, SamplingParams, SpecConfig
from verispec.models.hf import HFModel

WINDOW = 8
# Gemma 3's 5:1 pattern cut to four layers, with a global layer among them.
GEMMA3_LAYERS = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
VOCAB = 96


def windowed(kind: str, seed: int):
    torch.manual_seed(seed)
    kw = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, sliding_window=WINDOW,
              max_position_embeddings=512, initializer_range=0.25, eos_token_id=None,
              bos_token_id=None, pad_token_id=None)
    if kind == "mistral":  # every layer slides
        return MistralForCausalLM(MistralConfig(**kw)).eval()
    if kind == "gemma2":  # sliding and full layers alternate; soft-capping
        return Gemma2ForCausalLM(Gemma2Config(head_dim=16, **kw)).eval()
    if kind == "gemma3":  # five sliding layers to one full, each kind its own RoPE base
        return Gemma3ForCausalLM(Gemma3TextConfig(head_dim=16, layer_types=GEMMA3_LAYERS, **kw)).eval()
    if kind == "phi3":  # every layer slides (Phi-3-mini's window is 2047), fused q/k/v and gate/up
        return Phi3ForCausalLM(Phi3Config(**kw)).eval()
    # Qwen2: layers from max_window_layers on slide, the first ones attend to everything.
    return Qwen2ForCausalLM(Qwen2Config(use_sliding_window=True, max_window_layers=2, **kw)).eval()


PROMPT = [int(t) for t in torch.randint(0, VOCAB, (30,), generator=torch.Generator().manual_seed(5))]
PROMPT += [3, 4, 5, 6, 7] * 4  # 50 tokens, six windows; repeats give n-gram drafts

SPECS = {
    "ngram": SpecConfig("ngram", k=4),
    "self:1": SpecConfig("draft", draft="self:1", k=4),
    "random": SpecConfig("draft", draft="random", k=5),
    "tree": SpecConfig("draft", draft="self:2", k=4, tree=12, tree_shape="topb", tree_branch=3),
}


@pytest.fixture(scope="module", params=["mistral", "qwen2"])
def kind(request):
    return request.param


@pytest.fixture(scope="module")
def reference(kind):
    model = windowed(kind, 0)
    ids = torch.tensor([PROMPT])  # an explicit mask: a token equal to pad_token_id is no padding
    want = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=40,
                          min_new_tokens=40, pad_token_id=0)[0, len(PROMPT):].tolist()
    return model, want


@pytest.mark.parametrize("slack", [12, 256])  # 12 < the 90 positions: the trim runs
def test_greedy_equals_transformers_generate_past_the_window(kind, reference, slack):
    model, want = reference
    engine = Engine(HFModel(model, kind, window_slack=slack))
    engine._drafts["random"] = HFModel(windowed(kind, 1), "random", window_slack=slack)
    fixed = SamplingParams(max_new_tokens=40, ignore_eos=True)
    assert engine.generate(PROMPT, fixed, SpecConfig("none")).token_ids == want
    for name, spec in SPECS.items():
        out = engine.generate(PROMPT, fixed, spec)
        assert out.token_ids == want, name
        assert out.stats.drafted > out.stats.accepted  # rejections rolled back past the window


def test_trimmed_cache_keeps_the_window_and_refuses_deeper_rollbacks(reference):
    model, _ = reference
    target = HFModel(model, "m", window_slack=4)
    cache = target.new_cache()
    target.forward(torch.tensor(PROMPT), cache)
    for token in range(20):
        target.forward(torch.tensor([token]), cache)
    assert cache.length == len(PROMPT) + 20
    if cache.window is not None:
        kept = [layer.keys.shape[-2] for layer in cache.kv.layers if hasattr(layer, "base")]
        assert max(kept) < WINDOW - 1 + 2 * 4 + 1  # window + slack, not the whole context
        cache.truncate(cache.length - 4)  # within the slack
        with pytest.raises(ValueError, match="cannot roll a sliding-window cache back"):
            cache.truncate(cache.length - 12)
