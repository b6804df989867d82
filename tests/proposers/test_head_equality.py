"""The core laws with trained-head proposers: greedy output equals plain
greedy decoding on both backends, for a random head (next to nothing
accepted) and a briefly trained one; sampled output follows the target's
distribution (chi-square), whatever the heads propose."""
from __future__ import annotations

import pytest
import torch
from conftest import tiny_target
from distribution_support import exact_marginals, first_two_counts, worst_pvalue
from heads_support import random_head, trained
from test_greedy_equality import PROMPTS, plain, runs_equal_to_plain

from verispec import Engine, SamplingParams, SpecConfig
from verispec.step.lossless import compare_greedy


@pytest.fixture(scope="module", params=["hf", "native"])
def target(request, tiny, tiny_native):
    return tiny if request.param == "hf" else tiny_native


@pytest.fixture(scope="module")
def engine(target):
    return Engine(target)


@pytest.fixture(scope="module")
def heads(tmp_path_factory, tiny):
    """name -> (proposer, head dir). The heads are made for `tiny`'s weights;
    `tiny_native` holds the same fp32 weights, so they load on both backends."""
    root = tmp_path_factory.getbasetemp() / "heads"
    return {
        "eagle-random": ("eagle", random_head(root / "eq-eagle-random", "eagle", tiny)),
        "medusa-random": ("medusa", random_head(root / "eq-medusa-random", "medusa", tiny)),
        "eagle-trained": ("eagle", trained(root, tiny, "eagle").folder),
        "eagle-fused-trained": ("eagle", trained(root, tiny, "eagle", True).folder),
        "medusa-trained": ("medusa", trained(root, tiny, "medusa").folder),
    }


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("name", ["eagle-random", "medusa-random", "eagle-trained",
                                  "eagle-fused-trained", "medusa-trained"])
def test_greedy_equality_with_heads(engine, target, heads, name, k):
    kind, folder = heads[name]
    runs = runs_equal_to_plain(engine, target, SpecConfig(kind, k=k, head=str(folder)))
    accepted = sum(got.stats.accepted for got in runs)
    drafted = sum(got.stats.drafted for got in runs)
    assert drafted > 0
    if name.endswith("random"):
        assert accepted / drafted < 0.15


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_adaptive_k_with_heads_stays_lossless(engine, heads, kind):
    spec = SpecConfig(kind, k=6, adaptive=True, head=str(heads[f"{kind}-trained"][1]))
    for prompt in PROMPTS[:2]:
        want = plain(engine, prompt, 48)
        assert engine.generate(prompt, SamplingParams(max_new_tokens=48), spec).token_ids == \
            want.token_ids


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_a_limited_head_vocabulary_drafts_low_ids_only_and_stays_lossless(engine, target, heads,
                                                                          kind):
    """SpecConfig.head_vocab: the head drafts over the lowest ids of its draft
    vocabulary only (BPE merge order), and the output is still plain greedy."""
    folder = str(heads[f"{kind}-trained"][1])
    limit = target.vocab_size // 4
    spec = SpecConfig(kind, k=4, head=folder, head_vocab=limit)
    request = engine.new_request(PROMPTS[0], SamplingParams(max_new_tokens=4), spec)
    assert request.proposer.head.output.size == limit
    assert request.proposer.head.output.ids.tolist() == list(range(limit))
    drafted = 0
    for prompt in PROMPTS:
        want = plain(engine, prompt)
        got = engine.generate(prompt, SamplingParams(max_new_tokens=32), spec)
        comparison = compare_greedy(target, prompt, want.token_ids, got.token_ids)
        assert comparison.identical, comparison.describe()
        drafted += got.stats.drafted
    assert drafted > 0
    with pytest.raises(ValueError, match="head_vocab"):
        SpecConfig(kind, head_vocab=-1)




def _sampled_counts(tmp_path, kind: str, runs: int, **spec_options):
    """First and second tokens of `runs` seeded three-token requests on a vocab-8
    target, with a random head drafting two (or a tree: spec_options); and the
    exact marginals to expect."""
    target = tiny_target(11, layers=1, vocab=8)
    head = str(random_head(tmp_path / kind, kind, target, seed=1))
    prompt = [1, 2, 3]
    temperature = 2.0  # flatten the peaked tiny model so every token has mass
    counts, drafted, accepted = first_two_counts(
        Engine(target), prompt, SpecConfig(kind, k=2, head=head, **spec_options), temperature, runs)
    return counts, exact_marginals(target, prompt, temperature), drafted, accepted






@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_sampled_output_follows_the_target_with_heads(tmp_path, kind, full_size_runs):
    """2000 seeded requests: the first and second tokens' marginals pass
    chi-square against the target's exact ones, while the head's drafts
    (two per first step) are often accepted and often not."""
    runs = 2 * full_size_runs
    counts, marginals, drafted, accepted = _sampled_counts(tmp_path, kind, runs)
    assert drafted >= 2 * runs and 0.1 * drafted < accepted < 0.9 * drafted
    assert worst_pvalue(counts, marginals, runs) > 1e-3


def test_sampled_output_follows_the_target_with_a_limited_head_vocabulary(tmp_path,
                                                                        full_size_runs):
    """Drafts over 4 of 8 tokens put zero draft probability on the others; the
    output distribution is still the target's."""
    runs = 2 * full_size_runs
    counts, marginals, drafted, accepted = _sampled_counts(tmp_path, "eagle", runs, head_vocab=4)
    assert drafted >= 2 * runs and 0.1 * drafted < accepted < 0.9 * drafted
    assert worst_pvalue(counts, marginals, runs) > 1e-3


def test_distribution_check_catches_misreported_draft_probs(tmp_path, monkeypatch):
    """Control: a proposer that samples from its head but reports uniform
    draft_probs breaks the output distribution, and the check above sees it."""
    from verispec.proposers.base import Proposal
    from verispec.proposers.eagle import EagleProposer

    honest = EagleProposer.propose

    def misreported(self, ctx, k):
        proposal = honest(self, ctx, k)
        return Proposal(proposal.tokens, torch.full((len(proposal), 8), 1 / 8))

    monkeypatch.setattr(EagleProposer, "propose", misreported)
    runs = 400
    counts, marginals, _, _ = _sampled_counts(tmp_path, "eagle", runs)
    assert worst_pvalue(counts, marginals, runs) < 1e-6
