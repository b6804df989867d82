"""Grammar-constrained decoding under speculation, on llguidance.

Why llguidance (docs/structured_outputs.md has the measurements): on this CPU
with the default tokenizer its mask costs the same few microseconds per token
as xgrammar's, it compiles a schema about ten times faster (a per-request
cost here), it has no dependencies (xgrammar pulls triton and apache-tvm-ffi),
and its matcher has the three operations speculation needs: validate_tokens
(how much of a draft the grammar allows), rollback(n), and compute_ff_tokens
(the tokens the grammar forces next).

The rules that keep constrained speculation exact with respect to the
constrained target (the target's processed distribution, masked and renormalized):
- every verified row is masked with the grammar state after that row's own
  prefix: the matcher consumes the drafts row by row, then rolls back;
- a draft ends before its first forbidden token, so no row is spent on it.
  The kept drafts were each kept because they were allowed, so the draft
  distribution they follow is the drafted one masked and renormalized; those
  are the draft_probs the verifier gets (`masked_draft_probs`). Stopping before
  a forbidden token is then an ordinary adaptive draft length, decided by
  draft randomness the verifier never sees, and each step stays an exact
  speculative-sampling step (Leviathan et al. 2023, Thm. 1);
- the tokens the grammar forces are drafted first, one-hot: where the masked
  target allows only that token it is accepted with probability 1, and where
  it allows more (a forced string with several tokenizations) it is an
  ordinary draft, verified like any other;
- after verification the matcher keeps exactly the committed tokens, as the
  KV cache does.
The engine sees token ids only; the grammar text is compiled at the edge.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .config import Grammar  # noqa: F401  (re-exported: the grammar's home is config)

def ll_tokenizer(tokenizer, vocab_size: int):
    """llguidance's view of a transformers tokenizer, built once per engine."""
    import llguidance.hf

    return llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)


class GrammarLimitError(RuntimeError):
    """The grammar engine gave up mid-output (a resource limit): the request ends
    with this error rather than with output the grammar was not checked against."""


class Constraint:
    """One request's grammar state over token ids; it holds the committed tokens."""

    def __init__(self, grammar: Grammar, tokenizer, vocab_size: int, limits=None) -> None:
        """`limits`: llguidance's LLParserLimits; None gives ten times its default
        work per step, since a loose JSON schema can exceed the default mid-output."""
        import llguidance
        import llguidance.torch

        self._llt = llguidance.torch
        if limits is None:
            limits = llguidance.LLParserLimits(step_lexer_fuel=2_000_000, step_max_items=500_000)
        self.vocab_size = vocab_size
        self.matcher = llguidance.LLMatcher(tokenizer, grammar.llguidance(), limits=limits)
        if self.matcher.is_error():
            raise ValueError(f"invalid {grammar.kind} grammar: {self.matcher.get_error()}")
        self.forced_drafts = 0  # grammar-forced tokens drafted so far, for the stats

    def allowed_prefix(self, drafts: Sequence[int]) -> int:
        """How many leading drafts the grammar allows after the committed tokens."""
        keep = self.matcher.validate_tokens(list(drafts)) if len(drafts) else 0
        self._check("checking drafts")
        return keep

    def forced(self, limit: int) -> list[int]:
        """Up to `limit` tokens the grammar forces next (llguidance's fast-forward)."""
        if limit <= 0 or self.matcher.is_stopped():
            return []
        return list(self.matcher.compute_ff_tokens())[:limit]

    def masks(self, drafts: Sequence[int]) -> torch.Tensor:
        """[k + 1, vocab] bool, row i the tokens allowed after the committed ones and
        drafts[:i]; the drafts must be allowed (see allowed_prefix)."""
        llt = self._llt
        k = len(drafts)
        bitmask = llt.allocate_token_bitmask(k + 1, self.vocab_size)  # [k + 1, words] int32
        for i, token in enumerate(drafts):
            llt.fill_next_token_bitmask(self.matcher, bitmask, i)
            if not self.matcher.consume_token(int(token)):
                self._check("consuming a draft")
                raise RuntimeError(f"draft {i} is not allowed: {self.matcher.get_error()}")
        llt.fill_next_token_bitmask(self.matcher, bitmask, k)
        self._check("computing a mask")
        if k:
            self.matcher.rollback(k)
        # Bit j of word w is token 32 w + j: little-endian bytes, little bit order.
        bits = np.unpackbits(bitmask.numpy().view(np.uint8), axis=-1, bitorder="little")
        allowed = torch.from_numpy(bits[:, : self.vocab_size].astype(bool))  # [k + 1, vocab]
        # A row after the grammar's end (a drafted EOS) allows nothing; nothing there
        # is ever emitted (the stop cuts at EOS), but its bonus row must stay a distribution.
        empty = ~allowed.any(-1)  # [k + 1]
        if bool(empty.any()):
            allowed[empty] = True
        return allowed

    def _check(self, doing: str) -> None:
        """A matcher in its error state (a resource limit: llguidance reports, never
        raises) fills empty masks, which `masks` would read as the grammar's end and
        lift the constraint: stop here instead, so no forbidden token is emitted."""
        if self.matcher.is_error():
            raise GrammarLimitError(f"the grammar failed while {doing}: {self.matcher.get_error()}")

    def commit(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            if not self.matcher.consume_token(int(token)):
                self._check("committing a token")
                raise RuntimeError(f"committed token {token} is not allowed: "
                                   f"{self.matcher.get_error()}")


def apply_mask(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """[R, vocab] logits with every forbidden token at -inf."""
    return logits.float().masked_fill(~allowed.to(logits.device), float("-inf"))


def masked_draft_probs(draft_probs: torch.Tensor | None, allowed: torch.Tensor) -> torch.Tensor | None:
    """[k, vocab] draft rows masked and renormalized: the distribution a draft kept
    because it was allowed follows (module docstring). None stays one-hot."""
    if draft_probs is None:
        return None
    kept = draft_probs * allowed.to(draft_probs.device)
    return kept / kept.sum(-1, keepdim=True)


def constrained_proposal(constraint: Constraint, proposer, ctx, budget: int):
    """A chain of at most `budget` drafts: the grammar's forced tokens (one-hot),
    then the proposer's drafts after them, cut before the first forbidden token.
    Trees are drafted as chains here: pruning forbidden siblings would change the
    sibling distribution the multi-draft verifier relies on."""
    from dataclasses import replace as _replace

    from .proposers.base import Proposal

    forced = constraint.forced(budget)
    ctx = _replace(ctx, tokens=ctx.tokens + forced, tree_nodes=0) if forced else \
        _replace(ctx, tree_nodes=0)
    inner = proposer.propose(ctx, budget - len(forced)) if budget > len(forced) else \
        Proposal.empty()
    if inner.tree is not None:
        inner = _first_path(inner.tree)
    tokens = torch.cat([torch.tensor(forced, dtype=torch.long), inner.tokens.to(torch.long)])
    probs = None
    if inner.draft_probs is not None:
        one_hot = torch.nn.functional.one_hot(torch.tensor(forced, dtype=torch.long),
                                              inner.draft_probs.shape[-1]).float()
        probs = torch.cat([one_hot.to(inner.draft_probs.device), inner.draft_probs.float()])
    keep = constraint.allowed_prefix(tokens.tolist())
    constraint.forced_drafts += min(keep, len(forced))
    return Proposal(tokens[:keep], probs[:keep] if probs is not None else None)


def _first_path(tree):
    """A tree's first root-to-leaf path as a chain: each node there is its parent's
    first child, drawn from that child's own draft row."""
    from .proposers.base import Proposal
    from .token_tree import ROOT

    path, node = [], ROOT
    while tree.children(node):
        node = tree.children(node)[0]
        path.append(node)
    index = torch.tensor(path, dtype=torch.long)
    probs = tree.draft_probs[index] if tree.draft_probs is not None else None
    return Proposal(tree.tokens[index], probs)
