"""The law's checker (verispec.step.lossless): a changed token is found where it is, with the
plain run's top-2 gap, and called a mismatch unless that gap is a near-tie."""
from __future__ import annotations

from conftest import tiny_target

from verispec import Engine, SamplingParams, SpecConfig
from verispec.step.lossless import Comparison, compare_greedy, first_divergence


def test_a_changed_token_is_a_mismatch_at_its_place():
    target = tiny_target(0, layers=2)
    prompt = [1, 2, 3, 4]
    plain = Engine(target).generate(prompt, SamplingParams(max_new_tokens=8),
                                    SpecConfig("none", k=0)).token_ids
    spec = list(plain)
    spec[5] = (plain[5] + 1) % target.vocab_size
    cmp = compare_greedy(target, prompt, plain, spec)
    assert (cmp.identical, cmp.diverged_at, cmp.plain_token, cmp.spec_token) == (
        False, 5, plain[5], spec[5])
    assert cmp.top2_gap > 1e-3 and not cmp.near_tie and not cmp.ok  # the tiny model is peaked
    assert cmp.describe().startswith(f"MISMATCH at token 5: plain {plain[5]} vs spec {spec[5]}")
    assert compare_greedy(target, prompt, plain, plain[:6]).identical  # a stop cuts it short


def test_a_near_tie_is_tolerated_and_says_so():
    tie = Comparison(False, 2, 7, 9, 4e-4, near_tie=True)
    assert tie.ok and tie.describe() == "near-tie at token 2: plain 7 vs spec 9, top-2 gap 0.0004"
    assert Comparison(True).describe() == "identical"


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2
