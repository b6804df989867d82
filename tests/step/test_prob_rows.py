"""Lazy target rows (sampling.ProbRows): the sampled verifiers read a chain's rows
up to the first rejection and a tree's along the accepted path only, with the
same verdict as on the whole block, and each row is plain decoding's row."""
from __future__ import annotations

import torch

from verispec.config import SamplingParams
from verispec.step.rejection import verify_sampling, verify_tree_sampling
from verispec.step.sampling import ProbRows, logits_to_probs, make_generator
from verispec.step.token_tree import TokenTree

VOCAB = 2000
SAMPLING = SamplingParams(temperature=0.7, top_p=0.9)


def block(rows: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, VOCAB, generator=gen) * 3  # [rows, vocab]
    logits[:, :4] += 12.0  # tokens 0..3 share most of the mass, so drafts of them pass often
    return logits


def test_a_row_is_the_one_row_blocks_row():
    logits = block(9, 0)
    rows = ProbRows(logits, SAMPLING)
    assert len(rows) == 9 and rows.computed == 0
    for i in (4, 0, 4):
        assert torch.equal(rows[i], logits_to_probs(logits[i:i + 1], SAMPLING)[0])
    assert rows.computed == 2  # a row read twice is computed once
    assert torch.allclose(rows[3], logits_to_probs(logits, SAMPLING)[3], atol=1e-7)


def test_chain_reads_rows_up_to_the_first_rejection_and_agrees_with_the_block():
    k = 8
    computed, accepted = [], []
    for seed in range(200):
        logits = block(k + 1, seed)
        drafts = torch.randint(0, 4, (k,), generator=torch.Generator().manual_seed(seed))
        draft_probs = None
        if seed % 2:
            draft_probs = torch.full((k, VOCAB), 0.1 / (VOCAB - 4))
            draft_probs[:, :4] = 0.225  # [k, vocab], rows sum to 1
        lazy = ProbRows(logits, SAMPLING)
        dense = torch.stack([logits_to_probs(logits[i], SAMPLING) for i in range(k + 1)])
        verdict = verify_sampling(drafts, draft_probs, lazy, make_generator(seed))
        assert verdict == verify_sampling(drafts, draft_probs, dense, make_generator(seed))
        assert lazy.computed == verdict.num_accepted + 1
        computed.append(lazy.computed)
        accepted.append(verdict.num_accepted)
    assert min(accepted) == 0 and max(accepted) >= k // 2  # rejections early and late
    assert sum(computed) < 0.6 * 200 * (k + 1)  # rows past a rejection were never computed


def test_tree_reads_the_root_and_the_accepted_path_only():
    # Root -> (0, 1, 2), each -> (0, 1): nine nodes, ten rows.
    tokens = [0, 1, 2, 0, 1, 0, 1, 0, 1]
    parents = [-1, -1, -1, 0, 0, 1, 1, 2, 2]
    tree = TokenTree(torch.tensor(tokens), torch.tensor(parents))
    for seed in range(100):
        logits = block(len(tokens) + 1, seed)
        lazy = ProbRows(logits, SAMPLING)
        dense = torch.stack([logits_to_probs(row, SAMPLING) for row in logits])
        verdict = verify_tree_sampling(tree, lazy, make_generator(seed))
        assert verdict == verify_tree_sampling(tree, dense, make_generator(seed))
        assert lazy.computed == verdict.num_accepted + 1
