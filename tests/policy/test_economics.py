"""Speculative-decoding economics: closed forms, Monte Carlo, and the CLI."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from verispec.bench.calculator import (
    OptimalK,
    ceiling,
    expected_speedup,
    expected_tokens,
    optimal_k,
)
from verispec.bench.econ_cli import main
from verispec.bench.simulate import SimResult, simulate, spread_by_rounds, tokens_std
from verispec.policy.economics import CostModel, load_profile, tokens_per_pass


@pytest.mark.parametrize(
    "alpha, k, seed_value",
    [(0.9, 6, 5.2), (0.8, 4, 3.4), (0.5, 4, 1.9), (0.3, 4, 1.4)],
)
def test_seed_expected_tokens(alpha, k, seed_value):
    assert round(expected_tokens(alpha, k), 1) == seed_value


def test_tokens_per_pass_at_the_edges():
    assert tokens_per_pass([0.0] * 5)[5] == 1.0
    assert tokens_per_pass([1.0] * 5)[5] == 6.0
    assert abs(tokens_per_pass([0.5] * 2)[2] - 1.75) < 1e-12


def test_expected_tokens_edges():
    assert expected_tokens(0.0, 7) == 1.0
    assert expected_tokens(0.6, 0) == 1.0
    assert expected_tokens(0.8, 4) == pytest.approx(1 + 0.8 + 0.8**2 + 0.8**3 + 0.8**4)


def test_plain_decoding_is_break_even():
    assert expected_speedup(0.9, 0, CostModel(draft_cost=0.3, verify_overhead=0.5)) == 1.0


def test_optimal_k_interior_maximum():
    cost = CostModel(verify_overhead=0.1)
    best = optimal_k(0.8, cost)
    assert isinstance(best, OptimalK)
    assert 0 < best.k < 32
    assert best.k == 6 and best.speedup == pytest.approx(2.4696, abs=1e-4)
    assert expected_speedup(0.8, best.k - 1, cost) < best.speedup > expected_speedup(0.8, best.k + 1, cost)


def test_low_acceptance_long_draft_is_slower_than_plain():
    # Seed example: alpha 0.35, k 10 loses with a draft model but not with n-grams.
    draft_model = CostModel(draft_cost=0.1, verify_overhead=0.05)
    ngram = CostModel(draft_cost=0.0, verify_overhead=0.05)
    assert expected_speedup(0.35, 10, draft_model) < 1.0
    assert expected_speedup(0.35, 10, ngram) >= 1.0


@pytest.mark.parametrize("overhead", [0.05, 0.1, 0.25])
def test_ceiling_is_inverse_overhead(overhead):
    cost = CostModel(verify_overhead=overhead)
    assert ceiling(cost) == pytest.approx(1.0 / overhead)
    assert expected_speedup(1 - 1e-9, 10_000, cost) == pytest.approx(1.0 / overhead, rel=0.01)
    assert optimal_k(0.95, cost).speedup < ceiling(cost)


def test_ceiling_special_cases():
    assert ceiling(CostModel()) == math.inf
    assert ceiling(CostModel(draft_cost=0.7, verify_overhead=0.6)) == 1.0


def test_linear_profile_matches_linear_overhead():
    linear = CostModel(draft_cost=0.05, verify_overhead=0.1)
    profiled = CostModel(draft_cost=0.05, profile=tuple(2.0 * (1 + 0.1 * (n - 1)) for n in range(1, 6)))
    for k in range(0, 20):
        assert profiled.pass_cost(k) == pytest.approx(linear.pass_cost(k))
        assert expected_speedup(0.8, k, profiled) == pytest.approx(expected_speedup(0.8, k, linear))
    assert ceiling(profiled) == pytest.approx(ceiling(linear))
    best, want = optimal_k(0.8, profiled), optimal_k(0.8, linear)
    assert best.k == want.k and best.speedup == pytest.approx(want.speedup, rel=1e-12)


def test_load_profile(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"n": [1, 2, 4], "seconds": [0.02, 0.022, 0.026], "draft_cost_per_token": 0.05}))
    cost = load_profile(path)
    assert cost.draft_cost == 0.05
    assert cost.profile == pytest.approx((1.0, 1.1, 1.2, 1.3))
    assert cost.pass_cost(5) == pytest.approx(5 * 0.05 + 1.5)
    assert load_profile(path, draft_cost=0.0).draft_cost == 0.0


@pytest.mark.parametrize(
    "call",
    [
        lambda: expected_tokens(1.0, 4),
        lambda: expected_tokens(-0.1, 4),
        lambda: expected_tokens(float("nan"), 4),
        lambda: expected_tokens(0.5, -1),
        lambda: expected_tokens(0.5, 2.5),
        lambda: CostModel(draft_cost=-0.1),
        lambda: CostModel(verify_overhead=-0.1),
        lambda: CostModel(verify_overhead=0.1, profile=(1.0, 1.1)),
        lambda: CostModel(profile=(1.0,)),
        lambda: CostModel(profile=(1.0, 0.0)),
        lambda: optimal_k(0.5, CostModel(), k_max=-1),
        lambda: simulate(0.5, 4, rounds=0),
    ],
)
def test_bad_inputs_raise_value_error(call):
    with pytest.raises(ValueError):
        call()


def test_simulator_converges_to_theory():
    cost = CostModel(draft_cost=0.05, verify_overhead=0.1)
    for alpha, k in [(0.75, 4), (0.35, 10), (0.9, 6)]:
        result = simulate(alpha, k, rounds=200_000, seed=1, cost=cost)
        assert isinstance(result, SimResult) and result.rounds == 200_000
        assert result.theoretical == expected_tokens(alpha, k)
        # 200k rounds put the standard error near 0.1% of the mean; 2% is ~20 sigma.
        assert abs(result.tokens_per_pass - result.theoretical) < 0.02 * result.theoretical
        assert abs(result.speedup - result.theoretical_speedup) < 0.02 * result.theoretical_speedup


def test_simulator_is_seeded():
    assert simulate(0.7, 5, 50, seed=3) == simulate(0.7, 5, 50, seed=3)
    assert simulate(0.7, 0, 10, seed=3).tokens_per_pass == 1.0


def test_std_shrinks_with_rounds():
    rows = spread_by_rounds(0.75, 4, rounds_grid=(6, 24, 96, 384, 1536), trials=300, seed=0)
    stds = [row.std for row in rows]
    assert all(a > b for a, b in zip(stds, stds[1:]))
    for row in rows:
        assert row.std == pytest.approx(row.theoretical_std, rel=0.25)
        assert row.theoretical_std == pytest.approx(tokens_std(0.75, 4) / math.sqrt(row.rounds))


def test_cli_calc_text(capsys):
    assert main(["calc", "--alpha", "0.8", "--k", "4", "--verify-overhead", "0.1"]) == 0
    out = capsys.readouterr().out
    assert "3.362" in out and "2.40x" in out and "10.00x" in out


def test_cli_calc_json(capsys, tmp_path):
    assert main(["calc", "--alpha", "0.8", "--k", "4", "--verify-overhead", "0.1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["expected_tokens"] == pytest.approx(3.3616)
    assert data["optimal_k"] == 6 and data["ceiling"] == pytest.approx(10.0)

    path = tmp_path / "p.json"
    path.write_text(json.dumps({"n": [1, 2, 3], "seconds": [1.0, 1.1, 1.2]}))
    assert main(["calc", "--alpha", "0.8", "--k", "4", "--profile", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["expected_speedup"] == pytest.approx(3.3616 / 1.4)


def test_cli_simulate_json_and_plot(capsys, tmp_path):
    png = tmp_path / "speedup.png"
    argv = ["simulate", "--alpha", "0.75", "--k", "4", "--rounds", "24", "--seed", "0",
            "--trials", "50", "--plot", str(png), "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["rounds"] == 24 and len(data["spread"]) == 5
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "argv",
    [
        ["calc", "--alpha", "1.0"],
        ["calc", "--alpha", "-0.2"],
        ["calc", "--alpha", "0.5", "--k", "-1"],
        ["calc", "--alpha", "0.5", "--draft-cost", "-0.1"],
        ["calc", "--alpha", "0.5", "--verify-overhead", "-1"],
        ["calc", "--alpha", "0.5", "--profile", "/nonexistent/profile.json"],
        ["simulate", "--alpha", "0.5", "--rounds", "0"],
        ["simulate", "--alpha", "1.5"],
        ["simulate", "--alpha", "0.5", "--k", "-3"],
    ],
)
def test_cli_bad_values_exit_2(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"verispec {argv[0]}: error:") and "\n" not in err


def _reference_table(cost, max_width: int) -> np.ndarray:
    """StepCost's prediction as one numpy expression (np.interp between measured widths,
    the last slope beyond them, a running maximum): what its plain-float loop must equal."""
    rel = np.array(cost._rel[:max_width])
    weight, total, prior = np.array(cost._weight), np.array(cost._sum), np.array(cost._rel)
    seen = np.flatnonzero(weight > 0)
    if seen.size:
        means = total[seen] / weight[seen]
        rel = rel * np.interp(np.arange(max_width), seen, means / prior[seen])
        if seen.size >= 2 and max_width > seen[-1] + 1:
            slope = max(0.0, (means[-1] - means[-2]) / (seen[-1] - seen[-2]))
            beyond = np.arange(seen[-1] + 1, max_width)
            rel[beyond] = np.maximum(rel[beyond], means[-1] + slope * (beyond - seen[-1]))
    return np.concatenate([[0.0], np.maximum.accumulate(rel)])


@pytest.mark.parametrize("seed", range(20))
def test_step_cost_table_equals_the_interpolation_it_stands_for(seed):
    from verispec.policy.economics import StepCost

    rng = np.random.default_rng(seed)
    prior = CostModel(verify_overhead=float(rng.uniform(0, 0.2))) if seed % 2 else None
    cost = StepCost(prior, half_life=float(rng.uniform(4, 64)))
    for _ in range(int(rng.integers(0, 40))):
        width = int(rng.choice([1, 2, 3, 5, 9, 17, 33, int(rng.integers(1, 70))]))
        cost.observe([width], float(rng.uniform(0.004, 0.03)) * (1 + 0.1 * width))
        for asked in (1, 9, int(rng.integers(1, 100))):
            got = cost.table(asked)
            assert got.shape == (asked + 1,)
            np.testing.assert_allclose(got, _reference_table(cost, asked), rtol=1e-12, atol=0)


def test_step_cost_discounts_each_measured_width_by_its_age():
    """A width's prediction is the discounted mean of its own steps, each weighed by
    gamma ** (steps observed since), whatever other widths ran in between."""
    from verispec.policy.economics import StepCost

    cost = StepCost(CostModel(verify_overhead=0.1), half_life=4.0)
    gamma = 0.5 ** (1 / 4.0)
    for width, seconds in ((1, 0.010), (1, 0.012), (3, 0.020), (1, 0.011), (3, 0.024)):
        cost.observe([width], seconds)
    ages = (4, 3, 1)  # width 1's steps, counted back from the last observation
    want = (0.010 * gamma**4 + 0.012 * gamma**3 + 0.011 * gamma) / sum(gamma**a for a in ages)
    assert cost.table(1)[1] == pytest.approx(want, rel=1e-12)
    assert cost.table(3)[3] == pytest.approx((0.020 * gamma**2 + 0.024) / (gamma**2 + 1), rel=1e-12)
    assert cost.timed and not StepCost().timed


def test_an_estimate_skips_its_first_reading_only():
    """A first reading may carry warm-up: a draft price and a request's step-cost curve skip
    it (economics.WarmUp); a server's curve, which starts from timed forwards, keeps it."""
    from verispec.policy.economics import SecondsPerUnit, StepCost

    price = SecondsPerUnit()
    price.observe(0.050, 1)  # the first: skipped
    assert price.measured is None
    price.observe(0.002, 2)
    price.observe(0.004, 2)
    gamma = 0.5 ** (1 / 64.0)
    assert price.measured == pytest.approx((0.002 * gamma + 0.004) / (2 * gamma + 2))
    price.observe(0.0, 0)  # no units: not a reading
    price.observe(1.0, 1)  # a stall: counted at four times the estimate
    assert price.measured < 0.01
    request, server = StepCost(skip_first=True), StepCost()
    for cost in (request, server):
        cost.observe([1], 0.5)
        cost.observe([1], 0.0)  # an untimed step: not a reading either
    assert not request.timed and server.timed
    request.observe([1], 0.01)
    assert request.table(1)[1] == pytest.approx(0.01)


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.8, 0.95])
@pytest.mark.parametrize("k", [0, 1, 4, 9])
def test_expected_tokens_reduces_to_economics(alpha, k):
    assert tokens_per_pass([alpha] * k)[k] == pytest.approx(expected_tokens(alpha, k))


def test_expected_tokens_depth_dependent():
    assert tokens_per_pass([0.9, 0.5, 0.5])[3] == pytest.approx(1 + 0.9 + 0.45 + 0.225)
