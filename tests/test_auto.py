"""`--proposer auto`: the per-request choice among proposers by measured
goodput, its switch when the text changes character, its fall back to plain
decoding, and the laws it must keep (greedy output equals plain decoding)."""
from __future__ import annotations

import statistics

import pytest
import torch

from heads_support import trained
from test_greedy_equality import PROMPTS, plain
from verispec import Engine, SamplingParams, SpecConfig
from verispec.lossless import compare_greedy
from verispec.acceptance import Evidence
from verispec.economics import chain_tokens
from verispec.plan import AutoPolicy, Outcome, PlanContext
from verispec.proposers.auto import AutoProposer, _matched
from verispec.proposers.base import DraftContext, Proposal, Proposer
from verispec.token_tree import TokenTree


class Clock:
    """auto's clock in these tests: it moves when a Scripted proposer drafts and by each
    modelled pass (`_drive`)."""
    now = 0.0

    @classmethod
    def perf_counter(cls) -> float:
        return cls.now


@pytest.fixture(autouse=True)
def _modelled_clock(monkeypatch):
    monkeypatch.setattr("verispec.proposers.auto.time", Clock)


class Scripted(Proposer):
    """Guesses from a fixed future: right while `good(position)` holds, else wrong; each
    drafted token advances `Clock` by `seconds_per_token`."""

    def __init__(self, name: str, future: list[int], good, free: bool = False) -> None:
        self.name, self.future, self.good, self.free = name, future, good, free
        self.calls = 0
        self.asked: list[int] = []  # the draft length of each call
        self.seconds_per_token = 0.0
        self.rows: list[int] = []  # the hidden rows it was given, by the position they stand for

    def propose(self, ctx: DraftContext, k: int) -> Proposal:
        self.calls += 1
        self.asked.append(k)
        Clock.now += self.seconds_per_token * k
        if ctx.target_hidden:
            self.rows += ctx.target_hidden[0][:, 0].long().tolist()
        at = len(ctx.tokens)
        guess = [t if self.good(at + i) else (t + 1) % 50 for i, t in
                 enumerate(self.future[at:at + k])]
        return Proposal(torch.tensor(guess, dtype=torch.long))


def _drive(auto: AutoProposer, future: list[int], steps: int, k: int = 4,
           slope: float = 0.02, plans: list | None = None, tree: int = 0,
           caution: float = SpecConfig.auto_caution) -> list[str]:
    """A stand-in engine, run as `run_alone` runs a request: its policy plans, `auto`
    drafts, a perfect verifier commits the matched prefix + 1, and the pass takes the
    modelled T(n) = 2 ms (1 + slope (n - 1)) for the n positions it fed."""
    policy = AutoPolicy(SpecConfig("auto", k=k, tree=tree, auto_caution=caution))
    tokens = future[:5]
    hidden = torch.arange(4.0)[:, None]  # one row per committed position, valued by position
    picks = []
    for _ in range(steps):
        ctx = DraftContext(list(tokens), 5, (hidden,), tree_nodes=tree)
        plan = policy.plan(PlanContext(ctx, auto), k)
        ctx.candidate = plan.candidate
        if plans is not None:
            plans.append(plan)
        proposal = auto.propose(ctx, plan.k or 1)  # k = 0: the shadow call, drafts nothing
        assert plan.k or not len(proposal)
        picks.append(auto.active)
        tree = proposal.tree
        guesses = [[tree.token_list[i] for i in path] for path in tree.paths()] \
            if tree is not None else [proposal.tokens.tolist()]
        at = len(tokens)
        matched = max(_matched(guess, future[at:]) for guess in guesses)
        fed = len(proposal.tree) if proposal.tree is not None else len(proposal)
        seconds = 0.002 * (1 + slope * fed)
        Clock.now += seconds
        policy.observe(plan, Outcome(fed, matched, verify_seconds=seconds))
        tokens = future[:at + matched + 1]
        hidden = torch.arange(at - 1.0, len(tokens) - 1.0)[:, None]
    return picks


def test_expected_tokens_formula():
    assert chain_tokens(0.0, 5) == 1.0
    assert chain_tokens(1.0, 5) == 6.0
    assert abs(chain_tokens(0.5, 2) - 1.75) < 1e-12


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



def test_a_costly_probe_is_spaced_to_its_share_of_wall_time():
    """A losing candidate whose probe costs half a pass is probed at most about
    `probe_share` of the wall time, far less often than its back-off alone allows."""
    future = list(range(50)) * 80
    calls, share = {}, None
    for cost in (0.0, 0.001):
        copy = Scripted("ngram", future, lambda p: True, free=True)
        model = Scripted("eagle", future, lambda p: False)
        model.seconds_per_token = cost
        auto = AutoProposer({"ngram": copy, "eagle": model}, probe_every=2, probe_max=16,
                            probe_share=0.01)
        start = Clock.now
        _drive(auto, future, 500)
        calls[cost] = model.calls
        if cost:
            share = sum(model.asked) * cost / (Clock.now - start)
    assert calls[0.0] >= 30  # 2, 4, 8, 16, then every 16 steps
    assert calls[0.001] <= calls[0.0] / 3
    # Unpriced, its probes would take about 12% of the time; priced, 1% once measured
    # (the first two probes, at steps 2 and 4, come before a price).
    assert share <= 0.025

class Telling(Scripted):
    """A free proposer that knows before drafting whether it can guess (n-gram
    lookup's match length): evidence key 2 where it is right, 0 where not."""

    def evidence(self, ctx: DraftContext) -> Evidence:
        good = self.good(len(ctx.tokens))
        return Evidence(2 if good else 0, 0.9 if good else 0.0)


def _zones(picks_at: list[tuple[int, str]], copying) -> tuple[float, float]:
    copy = [pick for at, pick in picks_at if copying(at)]
    free = [pick for at, pick in picks_at if not copying(at)]
    return copy.count("ngram") / len(copy), free.count("eagle") / len(free)


def test_evidence_keys_switch_candidates_within_one_request():
    """Copies and free text alternate every 24 tokens. Keyed on the free
    candidate's evidence, auto drafts each zone with the candidate that is right
    there; one pooled alpha per candidate cannot follow zones this short."""
    future = list(range(50)) * 40
    copying = lambda p: (p // 24) % 2 == 0

    def run(copy_proposer):
        model = Scripted("eagle", future, lambda p: not copying(p))
        auto = AutoProposer({"ngram": copy_proposer, "eagle": model}, probe_every=4)
        steps = 0
        picks_at = []
        policy = AutoPolicy(SpecConfig("auto", k=4))
        tokens = future[:5]
        while len(tokens) < 700:
            ctx = DraftContext(list(tokens), 5, ())
            plan = policy.plan(PlanContext(ctx, auto), 4)
            ctx.candidate = plan.candidate
            proposal = auto.propose(ctx, plan.k or 1)
            picks_at.append((len(tokens), auto.active))
            at, matched = len(tokens), 0
            for guess in proposal.tokens.tolist():
                if guess != future[at + matched]:
                    break
                matched += 1
            policy.observe(plan, Outcome(len(proposal), matched,
                                         verify_seconds=0.002 * (1 + 0.02 * len(proposal))))
            tokens = future[:at + matched + 1]
            steps += 1
        return auto, picks_at[20:], (len(tokens) - 5) / steps

    keyed, picks, keyed_tau = run(Telling("ngram", future, copying, free=True))
    copy_share, free_share = _zones(picks, copying)
    assert copy_share >= 0.8 and free_share >= 0.8, (copy_share, free_share)
    assert keyed.tracks["eagle"].by_key[0].alpha > 0.8 > keyed.tracks["eagle"].by_key[2].alpha
    assert keyed.evidence(DraftContext(future[:30], 5)).key == 0
    _, pooled_picks, pooled_tau = run(Scripted("ngram", future, copying, free=True))
    assert keyed_tau > 1.2 * pooled_tau, (keyed_tau, pooled_tau)


def test_the_plan_prices_each_candidates_length_at_its_own_draft_cost():
    """One controller, the plan, chooses the candidate and its length together: at the
    same acceptance a free candidate drafts the whole cap, while a costly one (a draft
    token costs half the target pass) is asked for the length that pays at its cost."""
    future = list(range(50)) * 40
    right = lambda p: p % 3 != 0  # noqa: E731
    lengths = {}
    for name, free, cost in (("ngram", True, 0.0), ("eagle", False, 0.001)):
        proposer = Scripted(name, future, right, free=free)
        proposer.seconds_per_token = cost
        plans: list = []
        _drive(AutoProposer({name: proposer}), future, 60, k=6, slope=0.0, plans=plans)
        lengths[name] = sorted(p.k for p in plans[10:] if p.candidate == name)
    assert lengths["ngram"] and statistics.median(lengths["ngram"]) == 6, lengths
    assert lengths["eagle"] and statistics.median(lengths["eagle"]) <= 2, lengths


class Widened(Scripted):
    """The same guesses as a chain candidate, fed as a tree with `extra` wrong siblings
    below the root: the same accepted tokens for a wider pass."""

    def __init__(self, name, future, good, extra: int) -> None:
        super().__init__(name, future, good, free=True)
        self.extra = extra

    def propose(self, ctx: DraftContext, k: int) -> Proposal:
        chain = super().propose(ctx, k).tokens.tolist()
        wrong = [[(chain[0] + 1 + i) % 50] for i in range(self.extra)] if chain else []
        tree = TokenTree.from_paths([chain] + wrong) if chain else None
        return Proposal(tree.tokens, tree=tree) if tree is not None else Proposal.empty()


def test_a_wider_pass_is_priced_at_its_width():
    """A candidate that feeds more positions for the same accepted tokens (a lookahead
    tree, say) costs a wider pass on the step-cost curve: `auto` drafts with the narrow one."""
    future = list(range(50)) * 40
    right = lambda p: p % 4 != 0  # noqa: E731

    def shares(slope: float) -> float:
        chain = Scripted("ngram", future, right, free=True)
        wide = Widened("lookahead", future, right, extra=12)
        picks = _drive(AutoProposer({"lookahead": wide, "ngram": chain}), future, 80, k=4,
                       slope=slope, tree=16)[10:]
        return picks.count("ngram") / max(1, picks.count("ngram") + picks.count("lookahead"))

    assert shares(0.2) > 0.9


def test_rejects_bad_probe_settings():
    with pytest.raises(ValueError, match="probe_every"):
        AutoProposer({"ngram": Scripted("ngram", [], lambda p: True)}, probe_every=9, probe_max=8)
    with pytest.raises(ValueError, match="probe_share"):
        AutoProposer({"ngram": Scripted("ngram", [], lambda p: True)}, probe_share=0.0)


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
    assert names <= {"ngram", "suffix", "lookahead", "eagle", "none"} and \
        names & {"ngram", "suffix", "lookahead", "eagle"}


def test_a_named_draft_model_joins_the_candidates_and_output_stays_greedy():
    """`--proposer auto --draft ...` also weighs the draft model (the issue's
    candidates: ngram, eagle, draft, none); without one it is absent."""
    from conftest import tiny_engine

    engine = tiny_engine()
    prompt = [3, 17, 4, 9, 3, 17, 4]
    with_draft = SpecConfig("auto", k=4, draft="self:1")
    request = engine.new_request(prompt, SamplingParams(max_new_tokens=8), with_draft)
    assert "draft" in request.proposer.tracks
    request = engine.new_request(prompt, SamplingParams(max_new_tokens=8), SpecConfig("auto", k=4))
    assert "draft" not in request.proposer.tracks
    want = plain(engine, prompt, 40)
    got = engine.generate(prompt, SamplingParams(max_new_tokens=40), with_draft)
    assert got.token_ids == want.token_ids


class Unmatched(Telling):
    """A free candidate that never finds a match (suffix decoding on new text): its
    evidence says so, and it proposes nothing."""

    def evidence(self, ctx: DraftContext) -> Evidence:
        return Evidence(0, 0.0)

    def propose(self, ctx: DraftContext, k: int) -> Proposal:
        self.calls += 1
        return Proposal.empty()


def test_a_free_candidate_that_matched_nothing_is_not_chosen():
    """A free candidate is priced under its own evidence: with no match it has nothing to
    draft, so the step goes to one that has (it used to keep its untested prior, win the
    step and draft nothing, while n-gram lookup had a copy to draft)."""
    future = list(range(50)) * 40
    copying = lambda p: (p // 24) % 2 == 0  # noqa: E731
    copy = Telling("ngram", future, copying, free=True)
    silent = Unmatched("suffix", future, lambda p: True, free=True)
    picks = _drive(AutoProposer({"ngram": copy, "suffix": silent}), future, 120)
    assert "suffix" not in picks and silent.calls > 100
    assert picks.count("ngram") >= 15


def test_many_unlucky_candidates_do_not_win_on_luck():
    """Five free candidates each right on 7% of positions, at random, where a draft pays
    only above 10% (T(2) = 1.1 T(1)): their few-outcome estimates scatter, and the best
    of five usually clears the bar (the winner's curse). Priced a standard error down
    (SpecConfig.auto_caution), `auto` decodes plainly on most steps."""
    import random

    future = list(range(50)) * 40
    right = {}
    for i in range(5):
        rng = random.Random(i)
        right[f"c{i}"] = [rng.random() < 0.07 for _ in future]

    def drafting_share(caution: float) -> float:
        candidates = {name: Scripted(name, future, lambda p, r=hits: r[p], free=True)
                      for name, hits in right.items()}
        plans: list = []
        _drive(AutoProposer(candidates), future, 300, k=4, slope=0.1, plans=plans,
               caution=caution)
        return sum(1 for plan in plans[20:] if plan.k) / len(plans[20:])

    curse, cautious = drafting_share(0.0), drafting_share(1.0)
    assert curse > 0.3 and cautious < 0.5 * curse, (curse, cautious)


def test_caution_lowers_thin_estimates_most():
    from verispec.acceptance import Tally

    thin, thick = Tally.seeded(0.4, 3.0), Tally.seeded(0.4, 300.0)
    assert thin.lower(0.0) == pytest.approx(0.4) and thick.lower(0.0) == pytest.approx(0.4)
    assert thin.lower(1.0) < thick.lower(1.0) < 0.4
    assert 0.4 - thick.lower(1.0) < 0.03
    assert Tally.seeded(0.01, 1.0).lower(3.0) == 0.0
    with pytest.raises(ValueError, match="auto_caution"):
        SpecConfig("auto", auto_caution=-1.0)


def test_near_equal_winners_do_not_keep_a_loser_probing():
    """Two candidates as good as each other take turns winning under one key; a third is
    never right. Only a displaced winner is re-probed soon, so the loser's probe interval
    still doubles to its limit (it used to return to the start at every change of winner)."""
    import random

    future = list(range(50)) * 40
    rng = random.Random(3)
    hits = {name: [rng.random() < 0.6 for _ in future] for name in ("eagle", "medusa")}
    model = {name: Scripted(name, future, lambda p, r=r: r[p]) for name, r in hits.items()}
    loser = Scripted("lookahead", future, lambda p: False)
    auto = AutoProposer({**model, "lookahead": loser}, probe_every=4, probe_max=32)
    picks = _drive(auto, future, 240)
    changes = sum(1 for a, b in zip(picks, picks[1:]) if {a, b} == {"eagle", "medusa"})
    assert changes >= 10  # the winner does alternate
    assert auto.tracks["lookahead"].interval == 32
    assert loser.calls <= 12, loser.calls
