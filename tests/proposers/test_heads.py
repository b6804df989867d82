"""Trained heads: training end to end on a tiny target, resume, the on-disk
format and its target check, agreement of the training forward with drafting,
rollback of the EAGLE cache, and the (lossy) typical-acceptance verifier."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import tiny_target
from heads_support import random_head, tiny_prompts, tiny_settings, trained

from verispec import Engine, SamplingParams, SpecConfig, kernels
from verispec.proposers.base import DraftContext
from verispec.proposers.eagle import EagleProposer
from verispec.proposers.heads import bind, build_module, load_head, read_head
from verispec.proposers.heads.eagle import HeadCache
from verispec.proposers.medusa import MedusaProposer
from verispec.step.rejection import verify_typical
from verispec.step.sampling import make_generator
from verispec.training import trainer as trainer_module
from verispec.training.features import teacher_force
from verispec.training.pipeline import run_pipeline
from verispec.training.responses import GenerationSettings


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.getbasetemp() / "heads"


@pytest.fixture(scope="module", params=[("eagle", True), ("eagle", False), ("medusa", False)],
                ids=["eagle-fused", "eagle", "medusa"])
def result(request, root, tiny):
    kind, fused = request.param
    return trained(root, tiny, kind, fused)


def _window_mean(values, n=10):
    return sum(values[:n]) / n, sum(values[-n:]) / n


def test_training_lowers_the_loss_and_writes_the_head(result, tiny):
    first, last = _window_mean(result.history.loss)
    assert last < 0.9 * first, (first, last)
    folder = result.folder
    for name in ("config.json", "head.safetensors", "loss.png", "checkpoint.pt", "history.json"):
        assert (folder / name).is_file(), name
    assert (folder / "loss.png").read_bytes()[:4] == b"\x89PNG"
    stored = read_head(folder)
    config = stored.config
    assert tiny.weights_fingerprint() in config.target_fingerprints
    assert (config.hidden_size, config.vocab_size, config.num_target_layers) == (64, 96, 4)
    assert config.training["steps"] == 60 and config.training["response_tokens"] >= 600
    assert all(t.dtype == torch.bfloat16 for t in stored.state.values())
    if config.draft_vocab_size:
        assert stored.draft_vocab.numel() == config.draft_vocab_size == 48


def test_resume_continues_bit_for_bit(root, tiny, tmp_path, monkeypatch):
    """An interrupted run resumed from its checkpoint ends exactly where an
    uninterrupted one does (same batches, same weights, same curve)."""
    prompts = tiny_prompts(tiny.vocab_size)
    data = root / "data"
    straight = run_pipeline(tiny, prompts, tiny_settings("eagle", tmp_path / "a", data, steps=16))
    original = trainer_module.HeadTrainer.train_step

    def stop_at_eight(self):
        if self.step == 8:
            raise KeyboardInterrupt
        return original(self)

    monkeypatch.setattr(trainer_module.HeadTrainer, "train_step", stop_at_eight)
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(tiny, prompts, tiny_settings("eagle", tmp_path / "b", data, steps=16))
    monkeypatch.setattr(trainer_module.HeadTrainer, "train_step", original)
    with pytest.raises(ValueError, match="--resume"):
        run_pipeline(tiny, prompts, tiny_settings("eagle", tmp_path / "b", data, steps=16))
    resumed = run_pipeline(tiny, prompts, tiny_settings("eagle", tmp_path / "b", data, steps=16,
                                                        resume=True))
    assert resumed.history.loss == straight.history.loss
    a, b = read_head(tmp_path / "a").state, read_head(tmp_path / "b").state
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_init_fine_tunes_from_a_head_and_keeps_its_draft_vocabulary(root, tiny, tmp_path):
    """`train-head --init DIR` starts from DIR's weights and draft vocabulary: its
    first step's loss is the trained head's, well below a fresh head's, and a head
    of another shape is refused before any work."""
    prompts = tiny_prompts(tiny.vocab_size)
    base = trained(root, tiny, "eagle", fused=True)  # reduced draft vocabulary
    data = root / "data"

    def settings(out, **kw):
        return dataclasses.replace(tiny_settings("eagle", out, data, steps=2, fused=True), **kw)

    tuned = run_pipeline(tiny, prompts, settings(tmp_path / "tuned", init=base.folder))
    fresh = run_pipeline(tiny, prompts, settings(tmp_path / "fresh"))
    assert tuned.history.loss[0] < 0.8 * fresh.history.loss[0]
    assert torch.equal(tuned.draft_vocab, base.draft_vocab)
    assert tuned.config.training["init"] == str(base.folder)
    with pytest.raises(ValueError, match="not shaped like"):
        run_pipeline(tiny, prompts, settings(tmp_path / "other",
                                             init=trained(root, tiny, "eagle").folder))


@pytest.mark.skipif(not kernels.available(), reason="the batched decoder needs the native kernels")
def test_continuous_batching_answers_like_one_by_one(tiny, tiny_native, tmp_path):
    """The batched decoder (native: forward_batch, slots refilled as requests
    finish) writes the same greedy responses as the engine run per prompt."""
    from verispec.training.responses import generate_responses

    assert tiny_native.fuses_batches and not tiny.fuses_batches
    prompts = tiny_prompts(tiny.vocab_size, count=10)
    settings = GenerationSettings(max_new_tokens=24, token_budget=10_000, sample_fraction=0.0,
                                  batch_size=3)
    batched = generate_responses(tiny_native, prompts, tmp_path / "a.jsonl", settings)
    each = generate_responses(tiny, prompts, tmp_path / "b.jsonl", settings)
    assert len(batched) == len(each) == 10
    assert {s.id: s.response for s in batched} == {s.id: s.response for s in each}
    budget = dataclasses.replace(settings, token_budget=30)
    few = generate_responses(tiny_native, prompts, tmp_path / "c.jsonl", budget)
    assert 30 <= sum(len(s.response) for s in few) < 30 + 3 * 24


def test_training_prompts_cover_the_bench_kinds_but_never_its_prompts():
    from verispec.bench.workloads import WORKLOADS, load_workload
    from verispec.training.material import KINDS, build_prompts

    prompts = build_prompts(100, seed=1)
    assert len(prompts) == 100 and {p.kind for p in prompts} == set(KINDS)
    assert prompts == build_prompts(100, seed=1)  # deterministic
    bench = [m["content"] for w in WORKLOADS for p in load_workload(w) for m in p.messages]
    bench_lines = {ln.strip() for text in bench for ln in text.splitlines() if len(ln.strip()) >= 40}
    for prompt in prompts:
        content = prompt.messages[0]["content"]
        assert content not in bench and "human_eval" not in prompt.source
        shared = [ln for ln in content.splitlines() if ln.strip() in bench_lines]
        assert len(shared) <= 3, (prompt.id, shared)


def _proposals(head, target, kind: str, sampling: SamplingParams, seed: int = 3):
    """Drive a proposer through a fixed context as the engine would; collect its drafts."""
    tokens = [5, 17, 3, 40, 9, 9, 2, 71, 30, 12, 6]
    hidden = target.forward(torch.tensor(tokens), target.new_cache(),
                            hidden_layers=head.hidden_layers).hidden
    cls = EagleProposer if kind == "eagle" else MedusaProposer
    proposer = cls(head, sampling, make_generator(seed), target.eos_token_ids)
    out = []
    for end in (4, 7, 11):  # committed tokens[:end]; rows of the positions committed since
        start = 0 if end == 4 else {7: 3, 11: 6}[end]
        rows = tuple(h[start:end - 1] for h in hidden)
        out.append(proposer.propose(DraftContext(tokens[:end], 4, rows), 4))
    return out


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_saved_and_reloaded_head_proposes_identically(result, tiny, temperature):
    kind = result.config.type
    rounded = build_module(result.config)
    rounded.load_state_dict({k: v.to(torch.bfloat16).float()
                             for k, v in result.module.state_dict().items()})
    in_memory = bind(result.config, rounded, result.draft_vocab, tiny)
    reloaded = load_head(result.folder, kind, tiny)
    sampling = SamplingParams(temperature=temperature)
    for a, b in zip(_proposals(in_memory, tiny, kind, sampling),
                    _proposals(reloaded, tiny, kind, sampling)):
        assert a.tokens.tolist() == b.tokens.tolist() and len(a) > 0
        if temperature:
            assert torch.equal(a.draft_probs, b.draft_probs)


def test_a_head_for_other_weights_is_a_clear_error(result, tiny):
    kind = result.config.type
    other = tiny_target(5, layers=4)
    with pytest.raises(ValueError) as error:
        load_head(result.folder, kind, other)
    message = str(error.value)
    assert tiny.weights_fingerprint() in message and other.weights_fingerprint() in message
    with pytest.raises(ValueError, match="weights hash"):
        Engine(other).generate([1, 2, 3], SamplingParams(max_new_tokens=4),
                               SpecConfig(kind, k=2, head=str(result.folder)))
    wrong = "medusa" if kind == "eagle" else "eagle"
    with pytest.raises(ValueError, match=f"holds a {kind} head"):
        load_head(result.folder, wrong, tiny)
    with pytest.raises(ValueError, match="not a head directory"):
        load_head(result.folder / "data", kind, tiny)


def test_eagle_drafting_agrees_with_the_training_forward(root, tiny):
    """Row t of unroll step 0 is the first draft from committed rows <= t; row
    t + 1 of step 1 is the second draft, fed with the teacher's token."""
    head = load_head(random_head(root / "agree", "eagle", tiny, fused=True), "eagle", tiny)
    module = head.module
    seq = [4, 8, 15, 16, 23, 42, 7, 1, 60, 33]
    hidden, _, _ = teacher_force(tiny, seq, head.hidden_layers, 4)
    hidden = [h.float() for h in hidden]
    embeds = head.embed(torch.tensor(seq[1:] + [0]))
    with torch.no_grad():
        steps = module.unrolled(module.target_feature([h[None] for h in hidden]), embeds[None], 2,
                                head.parts.final_norm)
        for t in range(2, len(seq) - 3):
            cache = HeadCache(module.kv_heads, module.head_dim, torch.float32, torch.device("cpu"))
            out = module.step(module.target_feature([h[: t + 1] for h in hidden]), embeds[: t + 1],
                              torch.arange(t + 1), cache)
            first = head.parts.final_norm(out[-1:])
            assert torch.allclose(first[0], steps[0][0, t], atol=1e-5)
            second = module.step(first, embeds[t + 1: t + 2], torch.tensor([t + 1]), cache)
            assert torch.allclose(head.parts.final_norm(second)[0], steps[1][0, t + 1], atol=1e-5)


@pytest.mark.parametrize("fused", [False, True])
def test_eagle_cache_drops_rejected_drafts(root, tiny, fused):
    """After drafting and a partial acceptance, the proposer drafts exactly what
    a fresh proposer fed only the committed context drafts."""
    head = load_head(trained(root, tiny, "eagle", fused).folder, "eagle", tiny)
    tokens = [3, 17, 4, 9, 3, 17, 4, 50, 21]
    hidden = tiny.forward(torch.tensor(tokens), tiny.new_cache(),
                          hidden_layers=head.hidden_layers).hidden
    greedy = SamplingParams()
    used = EagleProposer(head, greedy, make_generator(0), frozenset())
    first = used.propose(DraftContext(tokens[:5], 5, tuple(h[:4] for h in hidden)), 4)
    assert len(first) == 4  # three predicted rows entered the cache
    # Two tokens committed (one accepted draft and a recovered token, say): rows 4 and 5.
    again = used.propose(DraftContext(tokens[:7], 5, tuple(h[4:6] for h in hidden)), 4)
    fresh = EagleProposer(head, greedy, make_generator(0), frozenset())
    want = fresh.propose(DraftContext(tokens[:7], 5, tuple(h[:6] for h in hidden)), 4)
    assert again.tokens.tolist() == want.tokens.tolist()
    assert used.cache.length == fresh.cache.length


def test_steps_that_draft_nothing_still_reach_the_eagle_head(root, tiny):
    """When a step drafts nothing (adaptive or a scheduler chose k = 0), its hidden
    rows are held and fed before the next draft: the head's cache then holds one
    real row per committed position, as if it had been called every step."""
    head = trained(root, tiny, "eagle").folder
    request = Engine(tiny).new_request([3, 17, 4, 9, 3, 17], SamplingParams(max_new_tokens=20),
                                       SpecConfig("eagle", k=4, head=str(head)))
    request.complete(tiny.forward_batch([request.prepare()])[0])  # the prefill
    for k in (0, 0, 0, 2, 0, 3):  # scheduler-chosen draft lengths
        request.complete(tiny.forward_batch([request.prepare(request.quote().plan(k))])[0])
        if k:
            # The last step's rows are fed at the next proposal; every earlier position is in.
            assert request.proposer.fed_until == request.proposer.real_rows
            assert request.proposer.fed_until >= len(request.tokens) - 1 - (k + 1)
    request.prepare(request.quote().plan(1))
    assert request.proposer.real_rows == len(request.tokens) - 1


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_held_out_evaluation_drafts_what_the_proposer_drafts(root, tiny, kind):
    """verispec.training.evaluate scores every anchor of an answer in one batched
    pass; at each anchor its chain is what the proposer drafts from that context
    up to the first draft greedy verification rejects (EAGLE's training forward
    feeds the answer's tokens, the proposer its own drafts: they part only after
    a rejected one; test_eagle_drafting_agrees_with_the_training_forward covers
    the deeper rows), and its accepted length is the chain's leading match."""
    from test_greedy_equality import PROMPTS

    from verispec.proposers.medusa import MedusaProposer
    from verispec.training.evaluate import Answer, HeadDrafts, accepted_lengths

    folder = trained(root, tiny, kind).folder
    head = load_head(folder, kind, tiny)
    drafter = HeadDrafts(str(folder), tiny)
    proposer_type = EagleProposer if kind == "eagle" else MedusaProposer
    accepted = 0
    for prompt in PROMPTS:
        tokens = prompt + Engine(tiny).generate(prompt, SamplingParams(max_new_tokens=16),
                                                SpecConfig("none", k=0)).token_ids
        hidden, top, _ = teacher_force(tiny, tokens, head.hidden_layers, 1)
        answer = Answer("t", torch.tensor(tokens), len(prompt), tuple(hidden), top[:, 0].long())
        chains = drafter.chains(answer, 3)
        lengths = accepted_lengths(chains, answer)
        anchors = range(max(0, len(prompt) - 1), len(tokens) - 4)
        assert len(lengths) == len(anchors)
        for a, length in zip(anchors, lengths):
            proposer = proposer_type(head, SamplingParams(), make_generator(0), frozenset())
            rows = tuple(h[:a + 1].float() for h in hidden)
            drafted = proposer.propose(DraftContext(tokens[:a + 2], len(prompt), rows), 3)
            matched = 0
            while matched < 3 and chains[a, matched] == tokens[a + 2 + matched]:
                matched += 1
            assert length == matched
            same = 3 if kind == "medusa" else min(matched + 1, 3)
            assert drafted.tokens.tolist()[:same] == chains[a, :same].tolist()
            accepted += matched
    if kind == "medusa":
        assert accepted > 0  # the tiny EAGLE head accepts next to nothing here


def test_typical_acceptance_thresholds():
    vocab = 6
    flat = torch.full((vocab,), 1 / vocab)  # entropy log 6: threshold min(0.09, 0.3 / 6) = 0.05
    peaked = torch.tensor([0.9, 0.06, 0.01, 0.01, 0.01, 0.01])  # threshold 0.09
    target_probs = torch.stack([flat, peaked, flat])
    verdict = verify_typical(torch.tensor([2, 1]), target_probs, make_generator(0))
    assert verdict.num_accepted == 1 and not verdict.bonus  # 0.167 > 0.05, but 0.06 < 0.09
    verdict = verify_typical(torch.tensor([5, 0]), target_probs, make_generator(0))
    assert verdict.num_accepted == 2 and verdict.bonus and verdict.tokens[:2] == [5, 0]
    one_hot = torch.eye(vocab)[[3, 1, 4]]
    verdict = verify_typical(torch.tensor([3, 2]), one_hot, make_generator(0))
    assert verdict.tokens == [3, 1]  # a one-hot target is plain greedy verification


def test_lossy_typical_is_reported_and_validated(root, tiny):
    head = str(random_head(root / "random-medusa", "medusa", tiny))
    engine = Engine(tiny)
    sampled = engine.generate([1, 2, 3], SamplingParams(temperature=1.0, seed=0, max_new_tokens=8),
                              SpecConfig("medusa", k=3, head=head, lossy_typical=True))
    assert sampled.stats.lossy and sampled.stats.to_dict()["lossy"]
    assert "LOSSY" in sampled.stats.format_line()
    greedy = engine.generate([1, 2, 3], SamplingParams(max_new_tokens=8),
                             SpecConfig("medusa", k=3, head=head, lossy_typical=True))
    assert not greedy.stats.lossy  # greedy verification ignores the flag: still exact
    with pytest.raises(ValueError, match="tree"):
        SpecConfig("medusa", tree=8, lossy_typical=True)


def test_cli_flags_reach_the_spec():
    from verispec.cli.args import spec_from
    from verispec.cli.main import build_parser

    args = build_parser().parse_args(["generate", "--prompt", "hi", "--proposer", "eagle",
                                      "--head", "/some/dir", "--lossy-typical"])
    spec = spec_from(args)
    assert (spec.proposer, spec.head, spec.lossy_typical) == ("eagle", "/some/dir", True)
    assert spec.head_vocab == SpecConfig.head_vocab == 8192
    args = build_parser().parse_args(["generate", "--prompt", "hi", "--head-vocab", "0"])
    assert spec_from(args).head_vocab == 0
    args = build_parser().parse_args(["train-head", "--type", "medusa", "--out", "x"])
    assert (args.head_type, args.tokens, args.steps, args.resume) == ("medusa", 100000, 500, False)


def test_shipped_heads_draft_losslessly_on_the_default_model(default_engine):
    """Out of the box: no --head, the shipped head for the default model."""
    from verispec.proposers.heads.format import shipped_heads
    from verispec.step.lossless import compare_greedy

    if not shipped_heads():
        pytest.skip("no shipped heads")
    prompt = default_engine.encode("Write a short poem about the sea.", chat=True)
    plain = default_engine.generate(prompt, SamplingParams(max_new_tokens=24),
                                    SpecConfig("none", k=0))
    for kind in ("eagle", "medusa"):
        got = default_engine.generate(prompt, SamplingParams(max_new_tokens=24), SpecConfig(kind, k=4))
        comparison = compare_greedy(default_engine.target, prompt, plain.token_ids, got.token_ids)
        assert comparison.ok, comparison.describe()
        assert got.stats.drafted > 0
