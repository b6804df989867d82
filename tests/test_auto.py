"""`--proposer auto`: the per-request choice among proposers by measured
goodput, its switch when the text changes character, its fall back to plain
decoding, and the laws it must keep (greedy output equals plain decoding)."""
from __future__ import annotations

import time

import pytest
import torch

from heads_support import trained
from test_greedy_equality import PROMPTS, plain
from verispec import Engine, SamplingParams, SpecConfig
from verispec.lossless import compare_greedy
from verispec.proposers.auto import AutoProposer, expected_tokens
from verispec.proposers.base import DraftContext, Proposal, Proposer


class Scripted(Proposer):
    """Guesses from a fixed future: right while `good(position)` holds, else wrong."""

    def __init__(self, name: str, future: list[int], good, free: bool = False) -> None:
        self.name, self.future, self.good, self.free = name, future, good, free
        self.calls = 0

    def propose(self, ctx: DraftContext, k: int) -> Proposal:
        self.calls += 1
        at = len(ctx.tokens)
        guess = [t if self.good(at + i) else (t + 1) % 50 for i, t in
                 enumerate(self.future[at:at + k])]
        return Proposal(torch.tensor(guess, dtype=torch.long))


def _drive(auto: AutoProposer, future: list[int], steps: int, k: int = 4) -> list[str]:
    """A stand-in engine: commit what a perfect verifier would (matched prefix + 1)."""
    tokens = future[:5]
    picks = []
    for _ in range(steps):
        proposal = auto.propose(DraftContext(list(tokens), 5), k)
        picks.append(auto.active)
        at = len(tokens)
        matched = 0
        for guess in proposal.tokens.tolist():
            if guess != future[at + matched]:
                break
            matched += 1
        tokens = future[:at + matched + 1]
        time.sleep(0.002)  # the target pass: drafting must be cheap next to it to pay
    return picks


def test_expected_tokens_formula():
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 5) == 6.0
    assert abs(expected_tokens(0.5, 2) - 1.75) < 1e-12


def test_picks_the_proposer_that_matches_and_switches_when_the_text_changes():
    future = list(range(50)) * 40
    switch = 300  # copying before, free writing after: the other proposer is right
    copy = Scripted("ngram", future, lambda p: p < switch, free=True)
    model = Scripted("eagle", future, lambda p: p >= switch)
    auto = AutoProposer({"ngram": copy, "eagle": model}, probe_every=4)
    picks = _drive(auto, future, 160)
    first = picks[10:40]
    assert first.count("ngram") == len(first)
    assert picks[-20:].count("eagle") >= 18
    # The costly candidate was not asked for drafts every step while losing.
    assert model.calls >= len(picks)  # it absorbs context every step (k=0 calls included)


def test_falls_back_to_plain_decoding_when_nothing_matches():
    future = list(range(50)) * 20
    bad = Scripted("ngram", future, lambda p: False, free=True)
    auto = AutoProposer({"ngram": bad})
    picks = _drive(auto, future, 60)
    assert picks[-20:].count("none") == 20


@pytest.mark.parametrize("backend", ["hf", "native"])
def test_auto_keeps_greedy_output_identical(tmp_path_factory, tiny, tiny_native, backend):
    target = tiny if backend == "hf" else tiny_native
    engine = Engine(target)
    head = trained(tmp_path_factory.getbasetemp() / "heads", tiny, "eagle").folder
    spec = SpecConfig("auto", k=4, head=str(head))
    names = set()
    for prompt in PROMPTS:
        want = plain(engine, prompt)
        got = engine.generate(prompt, SamplingParams(max_new_tokens=32), spec)
        comparison = compare_greedy(target, prompt, want.token_ids, got.token_ids)
        assert comparison.identical, comparison.describe()
        names |= {step.proposer for step in got.stats.steps}
    assert names <= {"ngram", "eagle", "none"} and names & {"ngram", "eagle"}
