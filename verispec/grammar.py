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
  ordinary draft, verified like any other (`SpecConfig.grammar_forced=False`
  stops drafting them, to measure what they bring; either way is exact);
- after verification the matcher keeps exactly the committed tokens, as the
  KV cache does;
- a draft that takes the grammar engine past one of its limits (llguidance
  then enters an error state it never leaves) costs the draft, not the
  request: the matcher is rebuilt from the committed tokens and the drafts
  stop after that one. Nothing is emitted from the row of the failed state:
  the request fails (`GrammarLimitError`) if the output goes on through it,
  exactly where plain decoding would fail. Stopping after that draft depends on
  kept drafts only (an ordinary adaptive draft length), so sampling stays
  exact. The tokens a grammar forces are a speculative aid only: if finding
  them exceeds a limit, none are drafted.
The engine sees token ids only; the grammar text is compiled at the edge.
"""
from __future__ import annotations

import contextlib
import time
from typing import Iterator, Sequence

import numpy as np
import torch

from .config import Grammar  # noqa: F401  (re-exported: the grammar's home is config)

def ll_tokenizer(tokenizer, vocab_size: int):
    """llguidance's view of a transformers tokenizer, built once per engine."""
    import llguidance.hf

    return llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)


# llguidance's per-step work limits (LLParserLimits fields) for every request: ten
# times its default, since a loose JSON schema can exceed the default mid-output.
LIMITS = {"step_lexer_fuel": 2_000_000, "step_max_items": 500_000}


class GrammarLimitError(RuntimeError):
    """The grammar engine gave up mid-output (a resource limit): the request ends
    with this error rather than with output the grammar was not checked against."""


class Constraint:
    """One request's grammar state over token ids; it holds the committed tokens.

    llguidance's error state is sticky (rollback does not leave it), so a draft
    that drives the grammar engine past a limit must not take the committed state
    with it: the matcher is rebuilt from the committed tokens, and the error
    counts only if the output really goes through that state, where plain
    decoding would fail in the same way."""

    def __init__(self, grammar: Grammar, tokenizer, vocab_size: int, limits=None,
                 draft_forced: bool = True) -> None:
        """`limits`: llguidance's LLParserLimits; None: `LIMITS`. `draft_forced`: draft the
        tokens the grammar forces (SpecConfig.grammar_forced; off only to measure them)."""
        import llguidance
        import llguidance.torch

        self._llt = llguidance.torch
        self._source, self._tokenizer = grammar.llguidance(), tokenizer
        self._limits = limits
        self.vocab_size = vocab_size
        self.committed: list[int] = []
        self.matcher = self._new_matcher()
        if self.matcher.is_error():
            raise ValueError(f"invalid {grammar.kind} grammar: {self.matcher.get_error()}")
        self.draft_forced = draft_forced
        self.forced_drafts = 0  # grammar-forced tokens drafted so far, for the stats
        # Time spent in the grammar (masks, validation, forced tokens, commits, unpacking
        # the bitmask), for the stats: what constraining costs per committed token.
        self.seconds = 0.0
        self.restores = 0  # matchers rebuilt after a draft's error, for the tests
        # The last allowed_prefix: its kept drafts, their rows, and the failure (if any)
        # of the state after them; masks reads them, commit clears them.
        self._checked: tuple[list[int], torch.Tensor, str | None] | None = None
        self._bad: tuple[list[int], str] | None = None  # drafts into a failed state, the error

    def _new_matcher(self):
        import llguidance

        limits = self._limits if self._limits is not None else llguidance.LLParserLimits(**LIMITS)
        return llguidance.LLMatcher(self._tokenizer, self._source, limits=limits)

    def _restore(self) -> None:
        """A fresh matcher at the committed tokens, for one a draft left in its error state."""
        matcher = self._new_matcher()
        if self.committed:
            matcher.consume_tokens(self.committed)
        self.matcher = matcher
        self.restores += 1
        self._check("replaying the committed tokens")

    def _rows(self, drafts: list[int]) -> tuple[torch.Tensor, int, str | None]:
        """The bitmask rows after the committed tokens and each draft, up to the first
        forbidden one: ([keep + 1, words] int32, keep, None or the error of the state
        after the kept drafts, whose row is then meaningless)."""
        llt = self._llt
        bitmask = llt.allocate_token_bitmask(len(drafts) + 1, self.vocab_size)
        llt.fill_next_token_bitmask(self.matcher, bitmask, 0)
        self._check("computing a mask")  # the committed state: plain decoding fails here too
        keep, pushed, failed = 0, 0, None
        for i, token in enumerate(drafts):
            if not (int(bitmask[i, token >> 5]) >> (token & 31)) & 1:
                break
            # A token consumed by a stopped matcher (EOS after a grammar that ended by
            # itself) is not on llguidance's rollback stack: rolling it back would
            # take a committed token with it.
            pushed += not self.matcher.is_stopped()
            self.matcher.consume_token(token)
            keep = i + 1
            if not self.matcher.is_error():
                llt.fill_next_token_bitmask(self.matcher, bitmask, keep)
            if self.matcher.is_error():
                failed = self.matcher.get_error()
                break
        if failed is not None:
            self._restore()
        elif pushed:
            self.matcher.rollback(pushed)
        return bitmask[: keep + 1], keep, failed

    @contextlib.contextmanager
    def _timed(self) -> Iterator[None]:
        """Adds the block's wall time to `seconds` (the grammar engine's share of a request)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds += time.perf_counter() - t0

    def allowed_prefix(self, drafts: Sequence[int]) -> int:
        """How many leading drafts the grammar allows after the committed tokens (their
        rows are kept for `masks`). A draft whose state the grammar engine gives up in
        is kept, as the last: whether it is accepted is the target's question, and the
        request fails only if it is (`commit`)."""
        drafts = [int(t) for t in drafts]
        with self._timed():
            rows, keep, failed = self._rows(drafts)
        self._checked = (drafts[:keep], rows, failed)
        return keep

    def forced(self, limit: int) -> list[int]:
        """Up to `limit` tokens the grammar forces next (llguidance's fast-forward); none
        when the search for them alone exceeds a limit (plain decoding never asks)."""
        if limit <= 0 or not self.draft_forced or self.matcher.is_stopped():
            return []
        with self._timed():
            tokens = list(self.matcher.compute_ff_tokens())
            if self.matcher.is_error():
                self._restore()
                return []
        return tokens[:limit]

    def masks(self, drafts: Sequence[int]) -> torch.Tensor:
        """[k + 1, vocab] bool, row i the tokens allowed after the committed ones and
        drafts[:i]; the drafts must be allowed (see allowed_prefix)."""
        with self._timed():
            drafts = [int(t) for t in drafts]
            checked, self._checked = self._checked, None
            if checked is not None and drafts == checked[0][: len(drafts)]:
                rows, failed = checked[1][: len(drafts) + 1], checked[2]
                if len(drafts) < len(checked[0]):
                    failed = None  # the failed state lies past the drafts verified
            else:
                rows, keep, failed = self._rows(drafts)
                if keep < len(drafts):
                    raise RuntimeError(f"draft {keep} is not allowed")
            self._bad = (drafts, failed) if failed is not None else None
            # Bit j of word w is token 32 w + j: little-endian bytes, little bit order.
            bits = np.unpackbits(rows.numpy().view(np.uint8), axis=-1, bitorder="little")
            allowed = torch.from_numpy(bits[:, : self.vocab_size].astype(bool))  # [k + 1, vocab]
            # A row after the grammar's end (a drafted EOS) allows nothing, and the row of a
            # failed state means nothing; nothing there is ever emitted (the stop cuts at
            # EOS, commit refuses to pass a failed state), but each must stay a distribution.
            empty = ~allowed.any(-1)  # [k + 1]
            if failed is not None:
                empty[-1] = True
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
        with self._timed():
            tokens = [int(t) for t in tokens]
            bad, self._bad, self._checked = self._bad, None, None
            if bad is not None and len(tokens) > len(bad[0]) and tokens[: len(bad[0])] == bad[0]:
                # The output goes on from a state the grammar engine gave up in: the
                # token after it was drawn from no mask, and plain decoding fails there.
                at = len(self.committed) + len(bad[0])
                raise GrammarLimitError(f"the grammar failed after {at} tokens of output: {bad[1]}")
            for token in tokens:
                if not self.matcher.consume_token(token):
                    self._check("committing a token")
                    raise RuntimeError(f"committed token {token} is not allowed: "
                                       f"{self.matcher.get_error()}")
                self.committed.append(token)


def apply_mask(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """[R, vocab] logits with every forbidden token at -inf. A row left with nothing
    (the grammar allows only EOS, which min_tokens holds back) ends the output: the
    grammar outranks min_tokens, and its allowed tokens become equally likely."""
    allowed = allowed.to(logits.device)
    masked = logits.float().masked_fill(~allowed, float("-inf"))
    dead = torch.isneginf(masked).all(-1)  # [R]
    if logits.device.type != "cpu":  # no host sync to ask whether a row is dead
        return torch.where(dead[:, None], torch.where(allowed, 0.0, float("-inf")), masked)
    if bool(dead.any()):
        masked[dead] = torch.where(allowed[dead], 0.0, float("-inf"))
    return masked


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
    tokens = torch.cat([torch.tensor(forced, dtype=torch.long), inner.tokens.to("cpu", torch.long)])
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
