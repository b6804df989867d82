"""The promise, swept over transformers' architectures: tiny random-init models
built from each family's own config (small sliding windows where the family
has them), saved with a tokenizer and loaded as a user would. On each, on
every backend that runs it, greedy n-gram, `self:L`, a random draft and a
draft tree equal transformers' own greedy `generate`, on a prompt longer than
any window; the prompt ids equal transformers' encoding. docs/architectures.md
holds the matrix."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import transformers as T
from scipy.stats import chisquare

from test_sliding_window import GEMMA3_LAYERS
from tokenizer_support import MESSAGES, TEXTS, family_tokenizer
from verispec import Engine, SamplingParams, SpecConfig
from verispec.models.hf import HFModel

WINDOW = 8
_DECODER = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.25)
# name: (config class, model class, config fields, tokenizer family)
ARCHS = {
    "llama": (T.LlamaConfig, T.LlamaForCausalLM, dict(_DECODER), "llama"),
    "mistral": (T.MistralConfig, T.MistralForCausalLM, dict(_DECODER, sliding_window=WINDOW), "llama"),
    "qwen2": (T.Qwen2Config, T.Qwen2ForCausalLM,
              dict(_DECODER, sliding_window=WINDOW, use_sliding_window=True, max_window_layers=2),
              "qwen2"),
    "qwen3": (T.Qwen3Config, T.Qwen3ForCausalLM, dict(_DECODER, head_dim=16), "qwen2"),
    "qwen3_moe": (T.Qwen3MoeConfig, T.Qwen3MoeForCausalLM,
                  dict(_DECODER, head_dim=16, num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=32, decoder_sparse_step=1), "qwen2"),
    "mixtral": (T.MixtralConfig, T.MixtralForCausalLM,
                dict(_DECODER, num_local_experts=4, num_experts_per_tok=2), "llama"),
    "gemma2": (T.Gemma2Config, T.Gemma2ForCausalLM,
               dict(_DECODER, head_dim=16, sliding_window=WINDOW), "gemma"),
    "gemma3": (T.Gemma3TextConfig, T.Gemma3ForCausalLM,
               dict(_DECODER, head_dim=16, sliding_window=WINDOW, layer_types=GEMMA3_LAYERS),
               "gemma"),
    "phi3": (T.Phi3Config, T.Phi3ForCausalLM, dict(_DECODER, sliding_window=WINDOW), "llama"),
    "gpt2": (T.GPT2Config, T.GPT2LMHeadModel,
             dict(n_embd=64, n_layer=4, n_head=4, n_positions=512, initializer_range=0.25), "gpt2"),
    "gpt_neox": (T.GPTNeoXConfig, T.GPTNeoXForCausalLM,
                 dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                      num_attention_heads=4, max_position_embeddings=512, initializer_range=0.25),
                 "gpt2"),
    "opt": (T.OPTConfig, T.OPTForCausalLM,
            dict(hidden_size=64, ffn_dim=128, num_hidden_layers=4, num_attention_heads=4,
                 max_position_embeddings=512, word_embed_proj_dim=64, init_std=0.25), "gpt2"),
    "falcon": (T.FalconConfig, T.FalconForCausalLM,
               dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                    initializer_range=0.25), "gpt2"),
}
NATIVE = {"llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3"}
SPECS = {
    "ngram": SpecConfig("ngram", k=4),
    "self:2": SpecConfig("draft", draft="self:2", k=4),
    "random": SpecConfig("draft", draft="random", k=4),
    "tree": SpecConfig("draft", draft="self:2", k=4, tree=12, tree_shape="topb", tree_branch=3),
}
NEW = 24


def build(name: str, vocab: int, seed: int):
    config_class, model_class, fields, _ = ARCHS[name]
    torch.manual_seed(seed)
    config = config_class(vocab_size=vocab, eos_token_id=None, bos_token_id=None,
                          pad_token_id=None, **fields)
    return model_class(config).eval()


def prompt_for(vocab: int) -> list[int]:
    """50 tokens (six windows), ending in repeats that give n-gram drafts."""
    generator = torch.Generator().manual_seed(5)
    return torch.randint(0, vocab, (30,), generator=generator).tolist() + [3, 4, 5, 6, 7] * 4


@pytest.fixture(scope="module", params=list(ARCHS))
def arch(request, tmp_path_factory):
    name = request.param
    tokenizer = family_tokenizer(ARCHS[name][3])
    vocab = len(tokenizer)
    model = build(name, vocab, 0)
    folder = tmp_path_factory.mktemp(name)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    prompt = prompt_for(vocab)
    ids = torch.tensor([prompt])  # an explicit mask: a token equal to pad_token_id is no padding
    want = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW,
                          min_new_tokens=NEW, pad_token_id=0)[0, len(prompt):].tolist()
    return name, folder, tokenizer, prompt, want


def test_every_proposer_equals_transformers_greedy(arch):
    name, folder, _, prompt, want = arch
    fixed = SamplingParams(max_new_tokens=NEW, ignore_eos=True)
    backends = ("hf", "native") if name in NATIVE else ("hf",)
    for backend in backends:
        engine = Engine(str(folder), backend=backend, dtype="fp32")
        assert engine.backend == backend
        draft = build(name, engine.target.vocab_size, 1)
        engine._drafts["random"] = (HFModel(draft, "random") if backend == "hf"
                                    else Engine(_saved(draft, folder), backend="native",
                                                dtype="fp32").target)
        assert engine.generate(prompt, fixed, SpecConfig("none")).token_ids == want, backend
        for label, spec in SPECS.items():
            out = engine.generate(prompt, fixed, spec)
            assert out.token_ids == want, (backend, label)


def _saved(model, folder: Path) -> str:
    target = folder.parent / f"{folder.name}-random-draft"
    if not target.exists():
        model.save_pretrained(target)
    return str(target)


def test_prompt_ids_and_the_backend_on_the_stats_line(arch):
    name, folder, tokenizer, _, _ = arch
    engine = Engine(str(folder))  # --backend auto
    for text in TEXTS:
        assert engine.encode(text) == T.AutoTokenizer.from_pretrained(str(folder))(text)["input_ids"]
    if tokenizer.chat_template:
        want = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
        assert engine.encode_messages(MESSAGES) == list(want["input_ids"])
    line = engine.generate([1, 2, 3], SamplingParams(max_new_tokens=2)).stats.format_line()
    if name in NATIVE:
        assert engine.backend == "native" and "backend=" not in line
    else:
        assert engine.backend == "hf" and "backend=hf (not native:" in line


@pytest.mark.parametrize("backend", ["hf", "native"])
@pytest.mark.parametrize("name", ["mistral", "gemma2"])
def test_sampled_output_follows_the_target_past_the_window(tmp_path, name, backend, full_size_runs):
    """2000 seeded three-token requests at T = 2 on a vocab-8 windowed model,
    prompt three windows long, a random draft of k = 2: the first and second
    tokens' marginals pass chi-square against the exact ones (transformers' for
    hf, the native model's own full forward for native)."""
    vocab, runs, temperature = 8, 2 * full_size_runs, 2.0
    fields = dict(ARCHS[name][2], sliding_window=4)
    config_class, model_class = ARCHS[name][:2]

    def make(seed):
        torch.manual_seed(seed)
        return model_class(config_class(vocab_size=vocab, eos_token_id=None, bos_token_id=None,
                                        pad_token_id=None, **fields)).eval()

    model = make(0)
    if backend == "hf":
        engine = Engine(HFModel(model, name))
        engine._drafts["random"] = HFModel(make(1), "random")
    else:
        model.save_pretrained(tmp_path / "target")
        make(1).save_pretrained(tmp_path / "draft")
        engine = Engine(str(tmp_path / "target"), backend="native", dtype="fp32")
        engine._drafts["random"] = Engine(str(tmp_path / "draft"), backend="native",
                                          dtype="fp32").target
    prompt = [1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4]

    @torch.inference_mode()
    def next_probs(tokens):
        if backend == "hf":
            logits = model(torch.tensor([tokens])).logits[0, -1]
        else:
            target = engine.target
            logits = target.forward(torch.tensor(tokens), target.new_cache()).logits[-1]
        return (logits / temperature).softmax(-1).double().numpy()

    first = next_probs(prompt)
    second = sum(first[x] * next_probs(prompt + [x]) for x in range(vocab))
    counts = np.zeros((2, vocab))
    drafted = accepted = 0
    for seed in range(runs):
        out = engine.generate(prompt, SamplingParams(temperature=temperature, seed=seed,
                                                     max_new_tokens=3, ignore_eos=True),
                              SpecConfig("draft", draft="random", k=2))
        counts[0, out.token_ids[0]] += 1
        counts[1, out.token_ids[1]] += 1
        drafted += out.stats.drafted
        accepted += out.stats.accepted
    assert 0.1 * drafted < accepted < 0.9 * drafted
    for observed, exact in zip(counts, (first, second)):
        assert chisquare(observed, exact / exact.sum() * runs).pvalue > 1e-3
