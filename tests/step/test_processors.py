"""Logit processors under speculation (verispec.step.processors): greedy output with
each processor is token-identical to plain decoding with it, on every proposer,
chain and tree, native and hf; plain decoding with it equals a naive reference
that recomputes every prefix; min_tokens holds EOS off inside accepted blocks."""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from conftest import CharTokenizer, tiny_target

from verispec import Engine, SamplingParams, SpecConfig
from verispec.step.processors import LogitProcessor, chain_ancestry

PROMPTS = [[3, 17, 4, 9, 3, 17, 4], [7, 7, 7, 7, 8, 7, 7, 7]]
N = 24
PROCESSORS = {
    "presence": dict(presence_penalty=2.0),
    "frequency": dict(frequency_penalty=1.5),
    "repetition": dict(repetition_penalty=3.0),
    "logit_bias": dict(logit_bias={5: 6.0, 11: 4.0, 40: -100.0}),
    "min_p": dict(min_p=0.5),
    "all": dict(presence_penalty=0.5, frequency_penalty=0.5, repetition_penalty=1.5,
                logit_bias={5: 3.0}, min_p=0.1),
}
SPECS = {
    "ngram": SpecConfig("ngram", k=4),
    "ngram-tree": SpecConfig("ngram", k=4, tree=12),
    "same-model": SpecConfig("draft", k=5, draft="same"),
    "same-model-tree": SpecConfig("draft", k=3, draft="same", tree=8),
    "random-draft": SpecConfig("draft", k=3, draft="random"),
}
PLAIN = SpecConfig("none", k=0)


def naive_processed(logits: torch.Tensor, prompt: list[int], output: list[int],
                    s: SamplingParams, eos: set[int]) -> torch.Tensor:
    """An independent, token-by-token statement of the processors' definitions."""
    out = logits.double().clone()
    for token, bias in s.logit_bias:
        out[token] += bias
    for token in set(prompt) | set(output):
        if s.repetition_penalty != 1.0:
            value = out[token]
            out[token] = value / s.repetition_penalty if value > 0 else value * s.repetition_penalty
    for token in set(output):
        out[token] -= s.frequency_penalty * output.count(token) + s.presence_penalty
    if len(output) < s.min_tokens:
        for token in eos:
            out[token] = float("-inf")
    return out


def naive_greedy(model, prompt: list[int], sampling: SamplingParams, eos: set[int]) -> list[int]:
    """Full recompute of every prefix with transformers, processed naively, argmax."""
    output: list[int] = []
    while len(output) < sampling.max_new_tokens:
        with torch.no_grad():
            logits = model(torch.tensor([prompt + output])).logits[0, -1]
        token = int(naive_processed(logits, prompt, output, sampling, eos).argmax())
        output.append(token)
        if token in eos:
            break
    return output


@pytest.fixture(scope="module", params=["hf", "native"])
def target(request, tiny, tiny_native):
    return tiny if request.param == "hf" else tiny_native


def _engine(target, eos: int | None = None) -> Engine:
    model = target
    if eos is not None:
        model = copy.copy(target)  # shares the weights, not the EOS set
        model.eos_token_ids = frozenset({eos})
    engine = Engine(model, tokenizer=CharTokenizer())
    engine._drafts["same"] = model
    engine._drafts["random"] = tiny_target(99, layers=1)
    return engine


@pytest.fixture(scope="module")
def engine(target):
    return _engine(target)


@pytest.mark.parametrize("name", list(PROCESSORS))
def test_plain_decoding_applies_the_processor(engine, tiny, name):
    """The plain loop with a processor equals the naive reference, and differs
    from unprocessed output (min_p cannot change an argmax: only the first holds)."""
    changed = False
    for prompt in PROMPTS:
        sampling = SamplingParams(max_new_tokens=N, **PROCESSORS[name])
        got = engine.generate(prompt, sampling, PLAIN).token_ids
        assert got == naive_greedy(tiny.model, prompt, sampling, set())
        changed |= got != engine.generate(prompt, SamplingParams(max_new_tokens=N), PLAIN).token_ids
    assert changed or name == "min_p"


HF_SPECS = ("ngram-tree", "same-model")  # transformers is slower: a chain and a tree suffice


@pytest.mark.parametrize("name", list(PROCESSORS))
def test_greedy_equality_with_processors(engine, target, name):
    specs = HF_SPECS if target.__class__.__name__ == "HFModel" else list(SPECS)
    sampling = SamplingParams(max_new_tokens=N, **PROCESSORS[name])
    for spec in specs:
        for prompt in PROMPTS:
            want = engine.generate(prompt, sampling, PLAIN)
            got = engine.generate(prompt, sampling, SPECS[spec])
            assert got.token_ids == want.token_ids, (name, spec, prompt)
            if spec.startswith("same-model"):
                # Drafts were accepted, so verified rows past the first carried drafts
                # in their prefix: the case a committed-only history gets wrong.
                assert got.stats.accepted > N // 2, (name, spec, prompt)


@pytest.mark.parametrize("spec", ["none", "ngram", "same-model", "same-model-tree"])
def test_min_tokens_holds_eos_off_inside_accepted_blocks(target, tiny, spec):
    prompt = PROMPTS[0]
    free = _engine(target).generate(prompt, SamplingParams(max_new_tokens=40), PLAIN).token_ids
    eos = free[2]
    engine = _engine(target, eos)
    config = PLAIN if spec == "none" else SPECS[spec]
    early = engine.generate(prompt, SamplingParams(max_new_tokens=40), config)
    assert early.token_ids == free[: free.index(eos) + 1] and early.finish_reason == "stop"
    sampling = SamplingParams(max_new_tokens=40, min_tokens=15)
    got = engine.generate(prompt, sampling, config)
    assert eos not in got.token_ids[:15]
    assert got.token_ids == naive_greedy(tiny.model, prompt, sampling, {eos})
    assert got.token_ids == engine.generate(prompt, sampling, PLAIN).token_ids
    if spec.startswith("same-model"):
        # The blocks were long: EOS was held off at rows inside accepted blocks.
        assert max(step.accepted for step in got.stats.steps) >= 3


def test_processor_rows_see_their_own_prefix():
    """Row i of a chain counts drafts 0..i-1; a tree row counts its ancestors and itself."""
    s = SamplingParams(frequency_penalty=1.0)
    proc = LogitProcessor(s, 6, frozenset())
    drafts = torch.tensor([2, 2, 4])
    rows = proc.process(torch.zeros(4, 6), [0, 1, 2], 2, drafts, chain_ancestry(3))  # [4, 6]
    assert rows[:, 2].tolist() == [-1.0, -2.0, -3.0, -3.0]
    assert rows[:, 4].tolist() == [0.0, 0.0, 0.0, -1.0]
    assert rows[:, 1].tolist() == [0.0] * 4  # prompt tokens are not output tokens


def test_bad_processor_settings_fail_before_model_work(engine):
    with pytest.raises(ValueError, match="logit_bias token ids"):
        engine.generate([1, 2], SamplingParams(logit_bias={10**6: 1.0}), PLAIN)
    for bad in (dict(presence_penalty=3.0), dict(repetition_penalty=0.0), dict(min_p=1.5),
                dict(min_tokens=-1), dict(logit_bias={1: 200.0}), dict(logprobs=21)):
        with pytest.raises(ValueError):
            SamplingParams(**bad)
    assert dataclasses.replace(SamplingParams(logit_bias={3: 1.0, 1: 2.0})).logit_bias == \
        ((1, 2.0), (3, 1.0))
