"""The law on tiny random-init models: greedy speculative output is token-
identical to plain greedy decoding, for every proposer and k, and EOS, stop
strings and max_new_tokens hold inside an accepted block."""
from __future__ import annotations

import copy
import dataclasses
import weakref

import pytest
import torch
from conftest import VOCAB, CharTokenizer, tiny_llama, tiny_target
from gguf_support import Q, TinyShape, write_tiny_gguf, write_tiny_kquant

from verispec import Engine, SamplingParams, SpecConfig, kernels
from verispec.models.hf import HFModel
from verispec.models.llama import NativeLlama
from verispec.models.native_gguf import native_from_gguf
from verispec.models.static_llama import StaticLlama
from verispec.step.lossless import compare_greedy

PROMPTS = [[3, 17, 4, 9, 3, 17, 4], [42], list(range(10, 40)), [7, 7, 7, 7, 8, 7, 7, 7]]
SPECS = {
    "ngram": SpecConfig(proposer="ngram"),
    "ngram-tree": SpecConfig(proposer="ngram", tree=16),
    "self:2": SpecConfig(proposer="draft", draft="self:2"),
    "same-model": SpecConfig(proposer="draft", draft="same"),
    "random-draft": SpecConfig(proposer="draft", draft="random"),
}


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """A tiny random model written as a Q4_0 GGUF (Q8_0 embedding), and the same
    values dequantized into a transformers-order safetensors folder."""
    folder = tmp_path_factory.mktemp("tiny-gguf")
    types = {k: Q.Q4_0 for k in ("head", "q", "k", "v", "o", "gate", "up", "down")} | {"embed": Q.Q8_0}
    shape = TinyShape(vocab=VOCAB, hidden=64, intermediate=128, layers=4, context=512)
    return write_tiny_gguf(folder / "tiny.gguf", types, shape, seed=7, reference=folder / "ref",
                           eos=None)


def _quant_ready() -> bool:
    return kernels.available() and int(Q.Q4_0) in kernels.quant_types()


@pytest.fixture(scope="module")
def tiny_quant(tiny_gguf):
    """The GGUF's blocks in verispec's kernels: the default path for a GGUF file."""
    if not _quant_ready():
        pytest.skip("verispec's kernels lack Q4_0 on this CPU")
    return native_from_gguf(tiny_gguf, torch.bfloat16, quant=True)


@pytest.fixture(scope="module")
def tiny_quant_i8(tmp_path_factory):
    """A tiny Q4_K_M file on the kernels' integer path (--weights quant-i8): mixed
    Q4_K / Q6_K stacks, a Q6_K head and a Q5_0 embedding, all on int8 activations."""
    if not _quant_ready() or not {int(Q.Q4_K), int(Q.Q6_K), int(Q.Q5_0)} <= kernels.quant_i8_types():
        pytest.skip("verispec's kernels have no integer path on this CPU")
    path = write_tiny_kquant(tmp_path_factory.mktemp("tiny-kquant") / "tiny.gguf", VOCAB)
    return native_from_gguf(path, torch.bfloat16, quant=True, int8=True)


@pytest.fixture(scope="module")
def tiny_dense_bf16(tiny_gguf):
    """The GGUF's values as a dense bf16 checkpoint (the --weights dense path)."""
    return NativeLlama.from_dir(tiny_gguf.parent / "ref", torch.bfloat16)


@pytest.fixture(scope="module", params=["hf", "native", "static", "quant", "quant-i8"])
def target(request, tiny, tiny_native):
    """The same tiny weights on each backend (static: the CUDA path's fixed-width
    steps, run on CPU), and a tiny GGUF run quantized, on the bf16 and the integer
    path: every suite below runs on all five."""
    if request.param in ("quant", "quant-i8"):
        return request.getfixturevalue("tiny_" + request.param.replace("-", "_"))
    if request.param == "static":
        return StaticLlama.from_native(tiny_native, width=8)
    return tiny if request.param == "hf" else tiny_native


@pytest.fixture(scope="module")
def engine(target):
    engine = Engine(target, tokenizer=CharTokenizer())
    # A same-model draft accepts everything; a random one almost nothing.
    engine._drafts["same"] = target
    engine._drafts["random"] = tiny_target(99, layers=1)
    return engine


# Keyed weakly on the engine itself: an id() key outlives its module-scoped engine,
# and the next backend's engine can be given the same id and read a stale answer.
_PLAIN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def plain(engine, prompt, n=32):
    """Plain greedy decoding through the same engine loop, memoized per prompt."""
    memo = _PLAIN.setdefault(engine, {})
    key = (tuple(prompt), n)
    if key not in memo:
        memo[key] = engine.generate(prompt, SamplingParams(max_new_tokens=n),
                                    SpecConfig(proposer="none", k=0))
    return memo[key]


def reference_hf_greedy(model: HFModel, prompt: list[int], n: int) -> list[int]:
    """transformers' own greedy generate: an independent check of the plain loop."""
    out = model.model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n,
                               do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_plain_loop_matches_transformers_generate(engine, target, tiny, request):
    """An independent reference for the plain loop: transformers' generate, or
    for the quantized GGUF, the same values as a dense bf16 checkpoint. The
    integer path's logits are its own (tests/kernels/test_quant_i8.py holds its kernel to
    a reference), so there the loop is held to greedy over full-prefix forwards,
    each into a fresh cache: no cache reuse, no incremental step."""
    if getattr(target, "weights_kind", "dense") == "quant-i8":
        for prompt in PROMPTS:
            ids = list(prompt)
            for _ in range(32):
                logits = target.forward(torch.tensor(ids), target.new_cache(128)).logits
                ids.append(int(logits[-1].argmax()))
            assert plain(engine, prompt).token_ids == ids[len(prompt):]
        return
    if getattr(target, "weights_kind", "dense") == "quant":
        dense = Engine(request.getfixturevalue("tiny_dense_bf16"))
        for prompt in PROMPTS:
            want = dense.generate(prompt, SamplingParams(max_new_tokens=32), SpecConfig("none", k=0))
            assert plain(engine, prompt).token_ids == want.token_ids
        return
    for prompt in PROMPTS:
        assert plain(engine, prompt).token_ids == reference_hf_greedy(tiny, prompt, 32)


def runs_equal_to_plain(engine, target, spec, n: int = 32) -> list:
    """Every prompt's speculative run of `n` tokens, each checked token for token against
    plain decoding (a divergence is described, never tolerated here)."""
    runs = []
    for prompt in PROMPTS:
        got = engine.generate(prompt, SamplingParams(max_new_tokens=n), spec)
        comparison = compare_greedy(target, prompt, plain(engine, prompt, n).token_ids,
                                    got.token_ids)
        assert comparison.identical, comparison.describe()
        assert got.stats.generated == n
        runs.append(got)
    return runs


@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("name", list(SPECS))
def test_greedy_equality(engine, target, name, k):
    for got in runs_equal_to_plain(engine, target, dataclasses.replace(SPECS[name], k=k)):
        if name == "same-model":
            assert got.stats.accepted == got.stats.drafted > 0
            assert got.stats.tau > 1 + k / 2
        if name == "random-draft":
            assert got.stats.acceptance_rate < 0.15


@pytest.mark.parametrize("tree", [0, 12])
def test_ngram_accepts_on_repetitive_model(tree):
    """Non-vacuity: on a small-vocabulary model whose output cycles, prompt
    lookup drafts and gets drafts accepted, and output is still identical."""
    target = tiny_target(1, layers=1, vocab=12)
    engine = Engine(target)
    want = engine.generate([1, 2, 3], SamplingParams(max_new_tokens=60), SpecConfig("none", k=0))
    got = engine.generate([1, 2, 3], SamplingParams(max_new_tokens=60),
                          SpecConfig("ngram", k=4, tree=tree))
    assert got.token_ids == want.token_ids
    assert got.stats.drafted > 0 and got.stats.accepted > 0
    assert got.stats.target_forwards < want.stats.target_forwards


def _eos_engine(target, eos: int) -> Engine:
    model = copy.copy(target)  # shares the weights, not the EOS set
    model.eos_token_ids = frozenset({eos})
    engine = Engine(model, tokenizer=CharTokenizer())
    engine._drafts["same"] = model
    return engine


def test_eos_inside_an_accepted_block(engine, target):
    prompt = PROMPTS[0]
    free = plain(engine, prompt, 40).token_ids
    eos_index = 9
    eos = free[eos_index]
    cut = free.index(eos)  # the first time that token appears
    eos_engine = _eos_engine(target, eos)
    want = eos_engine.generate(prompt, SamplingParams(max_new_tokens=40), SpecConfig("none", k=0))
    got = eos_engine.generate(prompt, SamplingParams(max_new_tokens=40),
                              SpecConfig("draft", k=8, draft="same"))
    assert want.token_ids == free[: cut + 1]
    assert got.token_ids == want.token_ids
    assert got.finish_reason == want.finish_reason == "stop"
    # The block that carried EOS had room for more: the cut happened inside it.
    last = got.stats.steps[-1]
    assert last.emitted < last.accepted + 1
    ignored = eos_engine.generate(prompt, SamplingParams(max_new_tokens=40, ignore_eos=True),
                                  SpecConfig("draft", k=8, draft="same"))
    assert ignored.token_ids == free


@pytest.mark.parametrize("max_new", [1, 2, 13, 17])
def test_max_new_tokens_inside_a_block(engine, max_new):
    prompt = PROMPTS[2]
    want = plain(engine, prompt, 40).token_ids[:max_new]
    got = engine.generate(prompt, SamplingParams(max_new_tokens=max_new),
                          SpecConfig("draft", k=8, draft="same"))
    assert got.token_ids == want
    assert got.finish_reason == "length"
    assert got.stats.generated == max_new


def test_stop_string_inside_a_block(engine):
    prompt = PROMPTS[0]
    tokenizer = CharTokenizer()
    free = plain(engine, prompt, 40).token_ids
    text = tokenizer.decode(free)
    stop = text[11:14]
    start = text.find(stop)
    last_token = start + len(stop) - 1  # one character per token
    for spec in (SpecConfig("none", k=0), SpecConfig("draft", k=8, draft="same"),
                 SpecConfig("ngram", k=5), SpecConfig("ngram", k=5, tree=12)):
        got = engine.generate(prompt, SamplingParams(max_new_tokens=40, stop=(stop,)), spec)
        assert got.token_ids == free[: last_token + 1], spec
        assert got.text == text[:start]
        assert got.finish_reason == "stop"


def test_stream_yields_committed_tokens_and_never_a_stop_prefix(engine):
    prompt = PROMPTS[0]
    tokenizer = CharTokenizer()
    free = plain(engine, prompt, 40).token_ids
    text = tokenizer.decode(free)
    stop = text[20:23]
    sampling = SamplingParams(max_new_tokens=40, stop=(stop,))
    chunks = list(engine.stream(prompt, sampling, SpecConfig("draft", k=4, draft="same")))
    assert [t for c in chunks for t in c.token_ids] == \
        engine.generate(prompt, sampling, SpecConfig("none", k=0)).token_ids
    shown = ""
    for chunk in chunks:
        shown += chunk.text
        assert stop not in shown
    assert shown == text[: text.find(stop)]
    assert chunks[-1].finish_reason == "stop"
    assert all(c.finish_reason is None for c in chunks[:-1])


def test_bf16_tiny_equality_up_to_proven_near_ties():
    """bf16 runs other kernels for k+1 rows than for 1: any divergence must be
    a proven near-tie (top-2 gap < 0.1), and we count how often that happens."""
    target = HFModel(tiny_llama(3, layers=4, dtype=torch.bfloat16), name="tiny-bf16")
    engine = Engine(target)
    engine._drafts["same"] = target
    near_ties = 0
    for prompt in PROMPTS:
        want = engine.generate(prompt, SamplingParams(max_new_tokens=32), SpecConfig("none", k=0))
        for spec in (SpecConfig("ngram", k=4), SpecConfig("draft", k=4, draft="same")):
            got = engine.generate(prompt, SamplingParams(max_new_tokens=32), spec)
            comparison = compare_greedy(target, prompt, want.token_ids, got.token_ids)
            assert comparison.ok, comparison.describe()
            near_ties += comparison.near_tie
    print(f"bf16 tiny: {near_ties} near-tie divergences in {2 * len(PROMPTS)} runs")
    assert near_ties <= len(PROMPTS)


def recording(inner):
    """A copy of `inner` that records the cache length before every forward."""
    model = copy.copy(inner)
    model.calls = []  # (cache length before, new positions)

    def forward(tokens, cache, *args, **kwargs):
        model.calls.append((cache.length, int(tokens.shape[0])))
        return type(inner).forward(model, tokens, cache, *args, **kwargs)

    model.forward = forward
    return model


@pytest.mark.parametrize("spec", [SpecConfig("ngram", k=4), SpecConfig("draft", k=5, draft="same"),
                                  SpecConfig("draft", k=3, draft="random")])
def test_cache_holds_exactly_the_committed_tokens(engine, target, spec):
    """Before each decode pass the target cache holds every committed token but
    the last: rejected positions were rolled back, not kept and not reset."""
    recorder = recording(target)
    eng = Engine(recorder)
    eng._drafts.update(engine._drafts)
    prompt = PROMPTS[3]
    got = eng.generate(prompt, SamplingParams(max_new_tokens=30), spec)
    decode_calls = recorder.calls[1:]  # the first call is the prefill
    committed = len(prompt)
    assert recorder.calls[0] == (0, len(prompt) - 1)
    for (length, fed), step in zip(decode_calls, got.stats.steps):
        assert length == committed - 1
        assert fed == step.drafted + 1
        committed += step.emitted
    assert len(decode_calls) == len(got.stats.steps)


@pytest.mark.parametrize("tree", [0, 12])
@pytest.mark.parametrize("ngram_min, ngram_max, k", [(1, 2, 2), (1, 4, 4), (4, 8, 8),
                                                     (4, 12, 3), (8, 16, 6)])
def test_output_identical_across_ngram_settings(ngram_min, ngram_max, k, tree):
    """As llama.cpp's server tests: draft size settings never change the output."""
    target = tiny_target(1, layers=1, vocab=12)
    eng = Engine(target)
    want = eng.generate([1, 2, 3], SamplingParams(max_new_tokens=50), SpecConfig("none", k=0))
    got = eng.generate([1, 2, 3], SamplingParams(max_new_tokens=50),
                       SpecConfig("ngram", k=k, tree=tree, ngram_min=ngram_min,
                                  ngram_max=ngram_max))
    assert got.token_ids == want.token_ids


def test_draft_with_shorter_context_than_target(target):
    """A draft whose context ends first stops drafting instead of failing (llama.cpp #22554)."""
    short = copy.copy(target)
    short.max_context = 20
    eng = Engine(target)
    eng._drafts["short"] = short
    prompt = PROMPTS[2][:12]
    want = eng.generate(prompt, SamplingParams(max_new_tokens=24), SpecConfig("none", k=0))
    got = eng.generate(prompt, SamplingParams(max_new_tokens=24), SpecConfig("draft", k=4,
                                                                                draft="short"))
    assert got.token_ids == want.token_ids
    assert got.stats.steps[-1].drafted == 0 and got.stats.drafted > 0


def test_prompt_that_nearly_fills_the_context():
    """A 56-token prompt in a 64-token context, k = 8: drafting shrinks to fit."""
    target = tiny_target(0, layers=2, max_positions=64)
    eng = Engine(target)
    eng._drafts["same"] = target
    prompt = list(range(1, 57))
    want = eng.generate(prompt, SamplingParams(max_new_tokens=8), SpecConfig("none", k=0))
    got = eng.generate(prompt, SamplingParams(max_new_tokens=8), SpecConfig("draft", k=8,
                                                                             draft="same"))
    assert got.token_ids == want.token_ids and len(got.token_ids) == 8


@pytest.mark.parametrize("spec", [SpecConfig("ngram", k=8, adaptive=True),
                                  SpecConfig("draft", k=8, draft="same", adaptive=True),
                                  SpecConfig("draft", k=8, draft="random", adaptive=True)])
def test_adaptive_k_stays_lossless(engine, target, spec):
    """Adaptive k changes only how much is drafted, never the output; with a
    useless draft it backs off toward k = 0. The useless draft here is as deep as
    the target: a 1-layer one costs so little beside a tiny target, whose rows are
    nearly free, that drafting 2 tokens at a 4% acceptance estimate can still price
    as a gain, so whether it backs off would hang on the machine's timing noise."""
    if spec.draft == "random":
        engine._drafts.setdefault("random-deep", tiny_target(99, layers=4))
        spec = SpecConfig("draft", k=8, draft="random-deep", adaptive=True)
    for prompt in PROMPTS[:2]:
        want = plain(engine, prompt, 48)
        got = engine.generate(prompt, SamplingParams(max_new_tokens=48), spec)
        assert got.token_ids == want.token_ids
        ks = [step.k for step in got.stats.steps]
        assert max(ks) <= 8
        if spec.draft == "random-deep":
            assert ks[-10:].count(0) >= 5


def test_adaptive_ngram_keys_k_on_its_match_length(engine, target, monkeypatch):
    """With adaptive k, the controller is told n-gram lookup's evidence each step (its
    matched suffix length, checked here against the context) and keeps acceptance
    per value: output stays plain greedy's, every k = 0 step with a match still
    measures a free shadow guess, and no step drafts more than its k."""
    from verispec.policy.acceptance import Evidence
    from verispec.policy.adaptive import AdaptiveK
    from verispec.proposers.ngram import MATCH_PRIOR, NgramIndex

    seen: list[tuple[Evidence, int]] = []
    choose, learn = AdaptiveK.choose, AdaptiveK._learn
    shadows: list[int] = []

    def spy_choose(self, max_k, evidence=None):
        k = choose(self, max_k, evidence)
        seen.append((evidence, k))
        return k

    def spy_learn(self, plan, outcome):
        if outcome.shadow is not None:
            shadows.append(outcome.shadow)
        return learn(self, plan, outcome)

    monkeypatch.setattr(AdaptiveK, "choose", spy_choose)
    monkeypatch.setattr(AdaptiveK, "_learn", spy_learn)
    prompt = PROMPTS[3] * 3 + PROMPTS[0]
    want = plain(engine, prompt, 64)
    got = engine.generate(prompt, SamplingParams(max_new_tokens=64), SpecConfig("ngram", k=8,
                                                                                adaptive=True))
    assert got.token_ids == want.token_ids
    tokens = list(prompt)
    for (evidence, k), step in zip(seen, got.stats.steps):
        index = NgramIndex(1, 4)
        index.update(tokens)
        assert evidence.key == index.longest_match()
        assert evidence.prior_alpha == MATCH_PRIOR[min(evidence.key, 4)]
        assert step.k == k and step.drafted <= k
        tokens += want.token_ids[len(tokens) - len(prompt):][:step.emitted]
    # Only a last step with no room left (max_new_tokens) skips the choice.
    assert len(got.stats.steps) - len(seen) in (0, 1)
    assert {e.key for e, _ in seen} - {0}  # matches were found: the evidence varied
    assert len(shadows) == sum(1 for e, k in seen if k == 0 and e.key)


@pytest.mark.skipif(not _quant_ready(), reason="verispec's kernels lack Q4_0 on this CPU")
@pytest.mark.parametrize("which", ["gguf-quant", "dense-bf16"])
@pytest.mark.parametrize("draft", ["quant:Q4_0", "quant:Q8_0", "quant:Q4_1:2", "quant:Q8_0:1"])
def test_quantized_self_draft_equals_greedy(request, which, draft):
    """The target's own layers cast to a block format draft for it: the output is
    plain greedy's, chains and trees, on a GGUF target and on a dense one."""
    target = request.getfixturevalue("tiny_quant" if which == "gguf-quant" else "tiny_dense_bf16")
    engine = Engine(target)
    model = engine.load_draft(draft)
    assert model.weights.embedding is target.weights.embedding
    assert model.weights.lm_head is target.weights.lm_head
    assert model.num_layers == (int(draft.split(":")[2]) if draft.count(":") == 2 else 4)
    accepted = drafted = 0
    for prompt in PROMPTS:
        want = engine.generate(prompt, SamplingParams(max_new_tokens=32), SpecConfig("none", k=0))
        for spec in (SpecConfig("draft", k=4, draft=draft), SpecConfig("draft", k=6, draft=draft, tree=10)):
            got = engine.generate(prompt, SamplingParams(max_new_tokens=32), spec)
            assert got.token_ids == want.token_ids, (draft, spec)
            accepted, drafted = accepted + got.stats.accepted, drafted + got.stats.drafted
    if draft in ("quant:Q8_0", "quant:Q4_0"):
        assert accepted > 0.5 * drafted  # the whole model, quantized: it agrees most of the time


def test_quantized_self_draft_errors(tiny_native):
    engine = Engine(tiny_native)
    with pytest.raises(ValueError, match="quant:FORMAT takes one of"):
        engine.load_draft("quant:Q3_K")
    with pytest.raises(ValueError, match="whole number of layers"):
        engine.load_draft("quant:Q4_0:two")
    if _quant_ready():
        with pytest.raises(ValueError, match="bf16 CPU target"):
            engine.load_draft("quant:Q4_0")  # tiny_native is fp32
