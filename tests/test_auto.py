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
        self.rows: list[int] = []  # the hidden rows it was given, by the position they stand for

    def propose(self, ctx: DraftContext, k: int) -> Proposal:
        self.calls += 1
        if ctx.target_hidden:
            self.rows += ctx.target_hidden[0][:, 0].long().tolist()
        at = len(ctx.tokens)
        guess = [t if self.good(at + i) else (t + 1) % 50 for i, t in
                 enumerate(self.future[at:at + k])]
        return Proposal(torch.tensor(guess, dtype=torch.long))


def _drive(auto: AutoProposer, future: list[int], steps: int, k: int = 4) -> list[str]:
    """A stand-in engine: commit what a perfect verifier would (matched prefix + 1)."""
    tokens = future[:5]
    hidden = torch.arange(4.0)[:, None]  # one row per committed position, valued by position
    picks = []
    for _ in range(steps):
        proposal = auto.propose(DraftContext(list(tokens), 5, (hidden,)), k)
        picks.append(auto.active)
        at = len(tokens)
        matched = 0
        for guess in proposal.tokens.tolist():
            if guess != future[at + matched]:
                break
            matched += 1
        tokens = future[:at + matched + 1]
        hidden = torch.arange(at - 1.0, len(tokens) - 1.0)[:, None]
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
    # While losing, the costly candidate is probed at doubling intervals, not called every step.
    losing = next(i for i, pick in enumerate(picks) if pick == "eagle")
    assert model.calls - picks.count("eagle") < losing / 3
    # Yet every hidden row reached it, in order: held back rows arrive before a probe.
    assert model.rows == list(range(len(model.rows)))


def test_probe_interval_doubles_while_losing_and_backlog_is_bounded():
    future = list(range(50)) * 40
    copy = Scripted("ngram", future, lambda p: True, free=True)
    model = Scripted("eagle", future, lambda p: False)
    auto = AutoProposer({"ngram": copy, "eagle": model}, probe_every=2, probe_max=16,
                        held_rows=8)
    picks = _drive(auto, future, 120)
    assert picks[5:].count("ngram") == len(picks) - 5
    # Probes at steps 2, 4, 8, 16, 32, then every 16: 9 calls in 120 steps.
    assert 7 <= model.calls <= 10
    assert auto.tracks["eagle"].interval == 16
    # Each probe saw at most the newest 8 rows plus its own step's, ending at the last one.
    assert model.rows == sorted(model.rows) and len(model.rows) <= 16 * model.calls


def test_rejects_bad_probe_settings():
    with pytest.raises(ValueError, match="probe_every"):
        AutoProposer({"ngram": Scripted("ngram", [], lambda p: True)}, probe_every=9, probe_max=8)


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
