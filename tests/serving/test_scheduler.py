"""The continuous-batching scheduler: batched outputs equal solo runs, caches
are released, queue limits and cancellation hold, and the batch's draft
lengths shrink with load (verispec.serving)."""
from __future__ import annotations

import gc
import threading
import time

import pytest
import torch
from conftest import VOCAB, CharTokenizer, tiny_engine

from verispec import Engine, SamplingParams, SpecConfig
from verispec.policy.economics import CostModel
from verispec.proposers.base import DraftContext
from verispec.serving.cost import Candidate, StepCost, allocate, calibrate
from verispec.serving.scheduler import (
    Failure,
    Progress,
    QueueFull,
    Scheduler,
    SchedulerConfig,
    Ticket,
)

PROMPTS = [[1, 2, 3, 4, 5, 1, 2, 3, 4], [7, 8, 9, 7, 8, 9, 7], [5], [3, 3, 3, 2, 2, 2, 1, 1],
           list(range(10, 40)), [4, 4, 4, 4, 4, 4]]
SPECS = [SpecConfig("none", k=0), SpecConfig("ngram", k=4), SpecConfig("ngram", k=8, adaptive=True),
         SpecConfig("draft", k=3, draft="same"), SpecConfig("ngram", k=4, tree=8),
         SpecConfig("draft", k=6, draft="same", adaptive=True)]


@pytest.fixture(scope="module")
def engine():
    return tiny_engine()


class Collector:
    """Sink for one ticket: tokens, the finish reason or the failure, and a done event."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.finish: str | None = None
        self.failure: Failure | None = None
        self.stats = None  # the request's Stats as of its last event
        self.done = threading.Event()

    def __call__(self, event) -> None:
        if isinstance(event, Progress):
            self.tokens.extend(event.tokens)
            self.stats = event.stats
            self.finish = event.finish_reason
            if event.finish_reason:
                self.done.set()
        else:
            self.failure = event
            self.done.set()


def make_scheduler(engine, **config) -> Scheduler:
    return Scheduler(engine.target, engine.new_request,
                     SchedulerConfig(**config))


def wait_idle(scheduler: Scheduler, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not scheduler.idle() and time.monotonic() < deadline:
        time.sleep(0.01)
    gc.collect()


@pytest.fixture(scope="module")
def tiny_quant_i8(tmp_path_factory):
    """A tiny Q4_K_M GGUF (Q4_K and Q6_K stacks, a Q5_0 embedding) on the kernels'
    integer path, whose rows must stay independent of their batch as the bf16 path's do."""
    from gguf_support import Q, write_tiny_kquant
    from verispec import kernels
    from verispec.models.native_gguf import native_from_gguf

    if not kernels.available() or not {int(Q.Q4_K), int(Q.Q6_K), int(Q.Q5_0)} <= kernels.quant_i8_types():
        pytest.skip("verispec's kernels have no integer path on this CPU")
    path = write_tiny_kquant(tmp_path_factory.mktemp("i8") / "tiny.gguf", VOCAB)
    return native_from_gguf(path, torch.bfloat16, quant=True, int8=True)


@pytest.fixture(params=["hf", "native", "quant-i8"])
def any_engine(request, engine):
    """The HF backend (forward_batch loops), the native one (rows fused per matmul)
    and the native one on the integer path of a quantized GGUF."""
    if request.param == "hf":
        return engine
    native = request.getfixturevalue("tiny_native" if request.param == "native" else "tiny_quant_i8")
    eng = Engine(native, tokenizer=CharTokenizer())
    eng._drafts["same"] = native
    return eng


def test_batched_greedy_equals_solo_and_releases_caches(any_engine):
    engine = any_engine
    sampling = SamplingParams(max_new_tokens=24)
    jobs = [(p, s) for p in PROMPTS for s in SPECS[:3]] + list(zip(PROMPTS, SPECS))
    # `auto` drafts chains and trees from n-gram lookup or suffix decoding.
    jobs += [(PROMPTS[0], SpecConfig("auto", k=4)), (PROMPTS[3], SpecConfig("auto", k=4, tree=8))]
    solo = {tuple(p): engine.generate(p, sampling, SpecConfig("none", k=0)).token_ids
            for p in PROMPTS}
    scheduler = make_scheduler(engine, max_num_seqs=5, max_queue=64)
    sinks = [Collector() for _ in jobs]
    scheduler.submit([Ticket(p, sampling, s, sink) for (p, s), sink in zip(jobs, sinks)])
    for sink in sinks:
        assert sink.done.wait(60)
    for (prompt, spec), sink in zip(jobs, sinks):
        assert sink.failure is None
        assert sink.tokens == solo[tuple(prompt)], (prompt, spec)
        assert sink.finish == "length"
    wait_idle(scheduler)
    gauges = scheduler.gauges()
    assert (gauges.queued, gauges.running, gauges.live_caches) == (0, 0, 0)
    assert scheduler.metrics.requests["finished"] == len(jobs)
    assert scheduler.metrics.batch_size.n > 0
    scheduler.close()


def test_seeded_sampling_in_a_batch_equals_solo(engine):
    """Fixed k and a deterministic proposer: the same drafts, so the request's
    own generator makes the same draws alone or batched."""
    sampling = SamplingParams(temperature=0.9, top_p=0.95, seed=7, max_new_tokens=20)
    spec = SpecConfig("ngram", k=3)
    prompt = PROMPTS[0]
    want = engine.generate(prompt, sampling, spec).token_ids
    scheduler = make_scheduler(engine, max_num_seqs=4)
    sinks = [Collector() for _ in range(4)]
    others = SamplingParams(temperature=1.0, seed=3, max_new_tokens=20)
    scheduler.submit([Ticket(prompt, sampling, spec, sinks[0])] + [
        Ticket(p, others, SpecConfig("ngram", k=8, adaptive=True), s)
        for p, s in zip(PROMPTS[1:], sinks[1:])])
    for sink in sinks:
        assert sink.done.wait(60)
    assert sinks[0].tokens == want
    scheduler.close()


def test_queue_limit_cancel_and_close(engine):
    long = SamplingParams(max_new_tokens=400, ignore_eos=True)
    scheduler = make_scheduler(engine, max_num_seqs=1, max_queue=1)
    running, queued, refused = Collector(), Collector(), Collector()
    first = Ticket(PROMPTS[4], long, SpecConfig("none", k=0), running)
    second = Ticket(PROMPTS[0], long, SpecConfig("none", k=0), queued)
    scheduler.submit([first])
    deadline = time.monotonic() + 10
    while scheduler.gauges().running == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    scheduler.submit([second])
    with pytest.raises(QueueFull):
        scheduler.submit([Ticket(PROMPTS[1], long, SpecConfig("none", k=0), refused)])
    assert scheduler.gauges().queued == 1
    scheduler.cancel(second)  # queued: dropped without ever holding a cache
    assert queued.done.wait(10) and queued.failure.reason == "cancelled"
    scheduler.cancel(first)  # running: dropped at the next step boundary, cache released
    assert running.done.wait(10) and running.failure.reason == "cancelled"
    wait_idle(scheduler)
    assert scheduler.gauges().live_caches == 0
    assert scheduler.metrics.requests["cancelled"] == 2
    assert scheduler.metrics.requests["rejected"] == 1
    # Graceful shutdown: a short request finishes, a long one is cancelled at the deadline.
    short, endless = Collector(), Collector()
    scheduler.submit([Ticket(PROMPTS[2], SamplingParams(max_new_tokens=4), SpecConfig(), short)])
    assert short.done.wait(10)
    scheduler.submit([Ticket(PROMPTS[3], long, SpecConfig("none", k=0), endless)])
    scheduler.close(timeout=0.05)
    assert short.finish == "length" and endless.failure.reason == "shutdown"
    with pytest.raises(Exception, match="shutting down"):
        scheduler.submit([Ticket(PROMPTS[0], long, SpecConfig(), Collector())])


def test_bad_proposer_settings_fail_only_their_request(engine):
    scheduler = make_scheduler(engine, max_num_seqs=4)
    bad, good = Collector(), Collector()
    scheduler.submit([Ticket(PROMPTS[0], SamplingParams(max_new_tokens=8),
                             SpecConfig("draft", k=3, draft="self:99"), bad),
                      Ticket(PROMPTS[1], SamplingParams(max_new_tokens=8), SpecConfig(), good)])
    assert bad.done.wait(10) and good.done.wait(10)
    assert bad.failure.reason == "invalid" and "self:L" in bad.failure.message
    assert good.failure is None and len(good.tokens) == 8
    scheduler.close()


# -- speculation under load -----------------------------------------------------

# Memory-bound up to 16 positions, then every position costs its share.
KNEE = CostModel(profile=tuple(max(1.0, n / 16) for n in range(1, 129)))


def test_k_shrinks_as_the_batch_fills_and_reaches_zero():
    cost = StepCost(KNEE, fused=True)
    totals = []
    for batch in (1, 2, 4, 8, 12, 16, 32):
        ks = allocate([Candidate(1, 8, [0.7] * 8) for _ in range(batch)], cost)
        assert max(ks) - min(ks) <= 8 and all(0 <= k <= 8 for k in ks)
        totals.append(sum(ks) / batch)
    assert totals == sorted(totals, reverse=True) and totals[0] == 8
    assert totals[-2] == totals[-1] == 0  # compute-bound: no speculation at all


def test_allocation_favours_acceptance_and_respects_fixed_and_prefill():
    cost = StepCost(KNEE, fused=True)
    ks = allocate([Candidate(1, 8, [0.9] * 8), Candidate(1, 8, [0.1] * 8),
                   Candidate(1, 5, [0.5], fixed=True), Candidate(40, 0, [0.0], decoding=False)],
                  cost)
    assert ks[2] == 5 and ks[3] == 0
    assert ks[0] > ks[1]
    # Useless drafts are never worth a position past the knee.
    assert allocate([Candidate(1, 8, [0.0] * 8) for _ in range(20)], cost) == [0] * 20


def test_sequential_batches_choose_per_request():
    """The default forward_batch runs requests one by one: load changes nothing."""
    cost = StepCost(KNEE, fused=False)
    assert allocate([Candidate(1, 8, [0.7] * 8) for _ in range(16)], cost) == [8] * 16


def test_step_cost_learns_the_measured_curve():
    cost = StepCost(CostModel(verify_overhead=0.0), fused=True, half_life=4.0)
    assert not cost.timed and cost.predict([1, 1]) == pytest.approx(1.0)
    for _ in range(20):
        cost.observe([1], 0.01)
        cost.observe([8] * 4, 0.04)  # 32 positions cost 4x one
    assert cost.timed
    assert cost.predict([1]) == pytest.approx(0.01, rel=1e-6)
    assert cost.predict([16, 16]) == pytest.approx(0.04, rel=1e-6)
    # Between measured widths the ratio is interpolated; beyond, the last ratio is kept.
    assert 0.01 < cost.predict([16]) < 0.04
    # A fused flat prior, corrected by the measurement, now stops speculating under load.
    assert sum(allocate([Candidate(1, 8, [0.6] * 8) for _ in range(32)], cost)) == 0


def test_noisy_dips_never_make_a_wider_step_look_cheaper():
    cost = StepCost(CostModel(verify_overhead=0.0), fused=True, half_life=4.0)
    for _ in range(10):
        cost.observe([16], 0.040)
        cost.observe([24], 0.050)
        cost.observe([32], 0.045)  # a lucky measurement
    table = cost.table(40)
    assert all(b >= a for a, b in zip(table[1:], table[2:]))
    assert table[32] == pytest.approx(0.050)


def test_drafting_must_beat_plain_by_the_margin():
    # Predicted gain of one draft at alpha 0.5 on a flat step: +50%. At 0.02 per
    # position past width 1 and alpha 0.03, it is +1%: under a 2% margin, nobody drafts.
    flat = StepCost(CostModel(verify_overhead=0.0), fused=True)
    assert allocate([Candidate(1, 4, [0.5] * 4)], flat, margin=0.02) == [4]
    cost = StepCost(CostModel(verify_overhead=0.02), fused=True)
    weak = [Candidate(1, 4, [0.03] * 4) for _ in range(1)]
    assert allocate(weak, cost, margin=0.0) == [1]
    assert allocate(weak, cost, margin=0.02) == [0]
    # Fixed requests keep their k whatever the margin.
    assert allocate([Candidate(1, 3, [0.0], fixed=True)], cost, margin=0.5) == [3]


def test_host_work_per_step_makes_drafts_pay_under_load():
    """Past the knee every position costs its share of the forward, so drafts accepted
    at 0.8 do not pay against the forward alone; against the forward plus the host work
    each of the 16 requests' steps costs whatever it drafts (H), they do."""
    cost = StepCost(KNEE, fused=True, half_life=4.0)
    for _ in range(20):
        cost.observe([1] * 16, 0.016)  # 16 ms at the knee: each position past it, 1 ms
    batch = [Candidate(1, 4, [0.8] * 4) for _ in range(16)]
    assert sum(allocate(batch, cost)) == 0
    ks = allocate(batch, cost, overhead=0.008)  # 0.5 ms of host work per request
    assert sum(ks) >= 16 and max(ks) - min(ks) <= 1
    # A prior not yet in seconds has no scale for a measured H: it is left out.
    assert allocate(batch, StepCost(KNEE, fused=True), overhead=0.008) == \
        allocate(batch, StepCost(KNEE, fused=True))


def test_the_scheduler_measures_its_host_work_per_request(engine):
    """What a step spends beside the forward and the drafts (quotes, plans, feeds) is
    measured per decoding request, for the allocator's H."""
    scheduler = make_scheduler(engine, explore_every=0)
    sampling = SamplingParams(max_new_tokens=24)
    sinks = [Collector() for _ in PROMPTS[:4]]
    scheduler.submit([Ticket(prompt, sampling, SpecConfig("ngram", k=4, adaptive=True), sink)
                      for prompt, sink in zip(PROMPTS, sinks)])
    assert all(sink.done.wait(30) and sink.failure is None for sink in sinks)
    scheduler.close()
    for prompt, sink in zip(PROMPTS, sinks):
        assert sink.tokens == engine.generate(prompt, sampling,
                                              SpecConfig("ngram", k=4, adaptive=True)).token_ids
    assert scheduler._host.measured is not None and 0.0 < scheduler._host.measured < 0.1


def test_calibration_times_the_target(tiny_native):
    prior = calibrate(tiny_native, widths=(1, 4, 16), context=8, repeats=1)
    assert prior is not None and len(prior.profile) == 16 and prior.profile[0] == 1.0
    assert all(b >= a for a, b in zip(prior.profile, prior.profile[1:]))
    assert calibrate(tiny_native, widths=(1, 4), context=tiny_native.max_context) is None


def test_plain_requests_reserve_no_draft_positions(engine):
    """`none` (with any k) feeds one position per step, and the allocator is told so."""
    sampling, spec = SamplingParams(max_new_tokens=6), SpecConfig("none", k=5)
    assert engine.new_request(PROMPTS[0], sampling, spec).room() == 0
    result = engine.generate(PROMPTS[0], sampling, spec)
    assert len(result.stats.steps) == 6 and all(r.k == 0 for r in result.stats.steps)


def test_fused_backends_are_detected(engine, tiny_native):
    """The cost model reads the model's own word: HF runs items in turn, the native
    backend fuses them when its kernels are built."""
    assert make_scheduler(engine).cost.fused is False
    scheduler = Scheduler(tiny_native, engine.new_request)
    assert scheduler.cost.fused is tiny_native.fuses_batches is tiny_native.row_kernels
    scheduler.close()


def test_new_adaptive_requests_start_from_the_pooled_acceptance(engine, monkeypatch):
    from verispec.policy.acceptance import Tally
    from verispec.policy.adaptive import AdaptiveK, FixedK
    from verispec.policy.plan import Outcome, Plan

    seeds = []
    original = AdaptiveK.seed
    monkeypatch.setattr(AdaptiveK, "seed", lambda self, a, n: (seeds.append((a, n)),
                                                                original(self, a, n)))
    scheduler = make_scheduler(engine)
    policy = FixedK()
    for k, drafted, accepted in [(4, 4, 1), (4, 4, 4), (4, 0, 0)]:
        policy.observe(Plan(k), Outcome(drafted, drafted, accepted, accepted < drafted))
    assert policy.outcomes == Tally(5.0, 1.0)
    scheduler._pool("ngram", policy.outcomes)  # 5 accepted drafts, 1 first rejection
    assert scheduler._pooled["ngram"] == Tally(5.0, 1.0)
    sinks = [Collector(), Collector()]
    scheduler.submit([Ticket(PROMPTS[0], SamplingParams(max_new_tokens=6),
                             SpecConfig("ngram", k=4, adaptive=True), sinks[0]),
                      Ticket(PROMPTS[1], SamplingParams(max_new_tokens=6),
                             SpecConfig("ngram", k=4), sinks[1])])
    assert all(sink.done.wait(30) and sink.failure is None for sink in sinks)
    assert seeds == [(5.0 / 6.0, 4.0)]  # the adaptive request only
    scheduler.close()


@pytest.mark.parametrize("allowed", [False, True])
def test_guard_off_windows_stop_adaptive_drafts_only(engine, monkeypatch, allowed):
    """While the guard says speculation is not paying, adaptive requests decode plainly
    and fixed-k requests still draft; outputs stay equal to the solo run either way."""
    from verispec.serving.guard import SpeculationGuard

    recorded = []
    monkeypatch.setattr(SpeculationGuard, "allow", lambda self, decoding: allowed)
    monkeypatch.setattr(SpeculationGuard, "record",
                        lambda self, decoding, tokens, seconds, measured=True:
                        recorded.append((decoding, tokens)))
    scheduler = make_scheduler(engine, explore_every=0, margin=0.0)
    sampling = SamplingParams(max_new_tokens=12)
    specs = [SpecConfig("ngram", k=4, adaptive=True), SpecConfig("ngram", k=4)]
    sinks = [Collector(), Collector()]
    scheduler.submit([Ticket(PROMPTS[0], sampling, spec, sink) for spec, sink in zip(specs, sinks)])
    assert all(sink.done.wait(30) and sink.failure is None for sink in sinks)
    scheduler.close()
    for spec, sink in zip(specs, sinks):
        assert sink.tokens == engine.generate(PROMPTS[0], sampling, spec).token_ids
    assert recorded and all(decoding >= 1 and tokens >= 1 for decoding, tokens in recorded)
    assert any(r.k for r in sinks[0].stats.steps) == allowed
    assert (scheduler.metrics.guard_held > 0) != allowed  # /metrics counts the held steps
    assert any(r.k for r in sinks[1].stats.steps)


@pytest.mark.parametrize("allow_shadow", [True, False])
def test_k0_steps_make_shadow_guesses_unless_held(engine, allow_shadow):
    """An adaptive n-gram request at k = 0 still guesses one token (a shadow) and the
    controller learns from it; a step the guard holds skips that guess."""
    request = engine.new_request(PROMPTS[0], SamplingParams(max_new_tokens=12),
                                 SpecConfig("ngram", k=4, adaptive=True))
    request.complete(engine.target.forward_batch([request.prepare()])[0])  # the prefill
    prior = request.policy.alphas.copy()
    for _ in range(6):
        plan = request.quote().plan(0) if allow_shadow else request.policy.plain(request.room())
        assert plan.k == 0 and plan.shadow == allow_shadow
        request.complete(engine.target.forward_batch([request.prepare(plan)])[0])
    learned = not (request.policy.alphas == prior).all()
    assert learned == allow_shadow


def test_scheduled_adaptive_ngram_prices_k_by_its_evidence(engine):
    """Served, the batch chooser prices an adaptive n-gram request's k with the
    acceptance of its current evidence (matched suffix length), and the step's
    outcome is counted under that evidence: the recorded keys are the context's
    longest match at each step, and the keyed estimates learn."""
    from verispec.policy.acceptance import Evidence
    from verispec.proposers.ngram import NgramIndex

    # No guard: a step it holds decodes plainly without consulting the request.
    scheduler = make_scheduler(engine, explore_every=0, margin=0.0, guard_window=0)
    sampling = SamplingParams(max_new_tokens=24)
    prompt = PROMPTS[0] * 4
    sink = Collector()
    scheduler.submit([Ticket(prompt, sampling, SpecConfig("ngram", k=6, adaptive=True), sink)])
    assert sink.done.wait(30) and sink.failure is None
    scheduler.close()
    assert sink.tokens == engine.generate(prompt, sampling, SpecConfig("none", k=0)).token_ids
    tokens = list(prompt)
    keys = []
    for step in sink.stats.steps:
        index = NgramIndex(1, 4)
        index.update(tokens)
        if step.evidence is not None:
            assert step.evidence == index.longest_match()
            keys.append(step.evidence)
        tokens += sink.tokens[len(tokens) - len(prompt):][:step.emitted]
    assert len(keys) >= len(sink.stats.steps) - 1 and max(keys) >= 1

    # The keyed estimate moves with outcomes reported under its key, not others'.
    request = engine.new_request(prompt, sampling, SpecConfig("ngram", k=6, adaptive=True))
    request.complete(engine.target.forward_batch([request.prepare()])[0])
    evidence = request.proposer.evidence(DraftContext(request.tokens, len(prompt)))
    controller = request.policy
    before = controller.evidence_alphas(evidence).copy()
    quote = request.quote()
    assert (quote.alphas == before).all() and quote.evidence == evidence
    request.complete(engine.target.forward_batch([request.prepare(quote.plan(3))])[0])
    assert not (controller.evidence_alphas(evidence) == before).all()
    other = Evidence(evidence.key + 1, 0.5)
    assert (controller.evidence_alphas(other) == 0.5).all()
