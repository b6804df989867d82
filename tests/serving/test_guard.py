"""The serving guard (verispec/serving/guard.py): per load level it keeps the
mode, speculating or not, whose realized tokens per second is higher, measured
in probes that alternate the two modes step by step, at doubling intervals."""
from __future__ import annotations

import random

import pytest

from verispec.serving.guard import SpeculationGuard


def _simulate(guard: SpeculationGuard, rate_on, rate_off, steps: int, decoding: int = 16,
              noise: float = 0.1, seed: int = 0) -> list[bool]:
    """Steps of one second's worth of tokens at the mode's rate (a callable of the
    step index), with multiplicative noise; returns the mode of every step."""
    rng = random.Random(seed)
    modes = []
    for i in range(steps):
        on = guard.allow(decoding)
        modes.append(on)
        rate = rate_on(i) if on else rate_off(i)
        guard.record(decoding, round(rate * rng.uniform(1 - noise, 1 + noise)), 1.0)
    return modes


@pytest.mark.parametrize("on, off, want_on", [(300.0, 330.0, False), (500.0, 330.0, True)])
def test_settles_on_the_faster_mode_and_probes_rarely(on, off, want_on):
    guard = SpeculationGuard(window=8, min_interval=2, max_interval=32)
    modes = _simulate(guard, lambda i: on, lambda i: off, 3000)
    late = modes[1000:]
    share = sum(m == want_on for m in late) / len(late)
    assert share > 0.93, share  # probes of the slower mode cost at most ~1/32 of windows
    measured_on, measured_off = guard.rates(16)
    assert (measured_on > measured_off) == want_on


def test_a_lead_within_the_edge_goes_to_plain_decoding():
    guard = SpeculationGuard(window=8, edge=0.03)
    modes = _simulate(guard, lambda i: 336.0, lambda i: 330.0, 2000, noise=0.01)
    assert sum(modes[1000:]) / 1000 < 0.1


def test_a_probe_that_wins_flips_the_mode_within_a_few_windows():
    guard = SpeculationGuard(window=8, min_interval=2, max_interval=8)
    # Speculation pays for 800 steps (copying), then costs 10% (free writing).
    modes = _simulate(guard, lambda i: 500.0 if i < 800 else 300.0, lambda i: 330.0, 1600)
    assert sum(modes[400:800]) / 400 > 0.85
    # Found by the first probe after the change (at most 8 windows on), then confirmed
    # by probes at the shortest interval: mostly off within 20 windows.
    assert sum(modes[960:1040]) / 80 < 0.3
    assert sum(modes[1000:]) / 600 < 0.2


@pytest.mark.parametrize("half_period", [16, 40])
def test_paired_probes_see_through_machine_drift(half_period):
    # The machine's speed swings by 50% every `half_period` steps (in step with the
    # 16-step windows, or not); speculating is steadily 5% slower, then 9% faster.
    # Windows of one mode set against windows of the other were decided by the
    # swings (the previous guard ran the wrong mode 9-100% of the time here).
    def machine(i):
        return 1.5 if (i // half_period) % 2 else 1.0

    for on, off, want_on in ((300.0, 316.0, False), (345.0, 316.0, True)):
        guard = SpeculationGuard(window=16)
        modes = _simulate(guard, lambda i: on * machine(i), lambda i: off * machine(i), 4000,
                          noise=0.05)
        share = sum(m == want_on for m in modes[1000:]) / 3000
        assert share > 0.95, (on, share)


def test_modes_that_run_alike_are_probed_rarely():
    # At a load where the allocator allots almost no drafts, "on" and "off" steps
    # cost the same, and each probe lands on either side of the edge by noise alone.
    # That must not keep the probes (and their host work) at the shortest interval.
    for seed in range(4):
        guard = SpeculationGuard(window=16, max_interval=32)
        modes = _simulate(guard, lambda i: 330.0, lambda i: 330.0, 8000, noise=0.15, seed=seed)
        assert sum(modes[2000:]) / 6000 < 0.06, seed  # ~0.19 for seed 1 if every probe reset


def test_unmeasured_steps_neither_count_nor_advance_the_window():
    guard = SpeculationGuard(window=4)
    assert [guard.allow(16) for _ in range(3)] == [True] * 3  # a probe starts "on"
    guard.record(16, 16, 1.0)
    assert not guard.allow(16)
    for _ in range(5):  # prefill steps, ten times slower: not the "off" mode's fault
        guard.record(16, 16, 10.0, measured=False)
        assert not guard.allow(16)
    for _ in range(3):
        guard.record(16, 10, 1.0)
    assert guard.rates(16) == ((16.0 + 10.0) / 2.0, (10.0 + 10.0) / 2.0)
    assert guard.allow(16)  # "on" led by more than the edge: the next window runs it


def test_a_step_timed_at_zero_seconds_is_not_measured():
    guard = SpeculationGuard(window=2)
    guard.record(16, 16, 1.0)  # the probe's "on" step
    guard.record(16, 5, 0.0)  # would end the probe with an "off" rate of 5 / 0
    assert not guard.allow(16)  # still waiting for a measured "off" step
    guard.record(16, 10, 1.0)
    assert guard.rates(16) == (16.0, 10.0)


def test_levels_are_powers_of_two_and_independent():
    guard = SpeculationGuard(window=4)
    assert [guard.level(n) for n in (1, 2, 3, 4, 5, 8, 9, 16, 17)] == [1, 2, 4, 4, 8, 8, 16, 16, 32]
    _simulate(guard, lambda i: 100.0, lambda i: 200.0, 400, decoding=16)
    _simulate(guard, lambda i: 300.0, lambda i: 100.0, 400, decoding=2)
    on16, off16 = guard.rates(16)
    on2, off2 = guard.rates(2)
    assert on16 < off16 and on2 > off2
    assert guard.rates(4) == (None, None)


def test_rejects_bad_settings():
    with pytest.raises(ValueError):
        SpeculationGuard(window=1)  # a probe needs a step of each mode
    with pytest.raises(ValueError):
        SpeculationGuard(min_interval=4, max_interval=2)
