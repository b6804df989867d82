"""One proposer interface, one registry.

A proposer is built per request by its registered factory and then asked,
step after step, for up to k draft tokens that continue the committed context.
It may return fewer (even none): the engine then verifies only what it got.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import torch

from verispec.policy.acceptance import Evidence

if TYPE_CHECKING:
    from verispec.config import SamplingParams, SpecConfig
    from verispec.models.base import TargetModel
    from verispec.step.token_tree import TokenTree

# The one empty draft every proposer may return: a step that drafts nothing should
# not pay for a fresh tensor, and no caller writes into a draft's tokens.
_NO_TOKENS = torch.empty(0, dtype=torch.long)


@dataclass
class Proposal:
    tokens: torch.Tensor  # [k'] int64 with k' <= k
    draft_probs: torch.Tensor | None = None  # [k', vocab]; None means a one-hot draft
    tree: "TokenTree | None" = None  # a tree of candidates instead of a chain (tokens unused)

    @staticmethod
    def empty() -> "Proposal":
        return Proposal(_NO_TOKENS)

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


@dataclass
class DraftContext:
    tokens: list[int]  # every committed token: prompt then output
    num_prompt: int  # how many of `tokens` are the prompt
    target_hidden: tuple[torch.Tensor, ...] = ()  # hidden states of the last committed
    # positions, for proposers that read the target's features (EAGLE, Medusa)
    tree_nodes: int | None = None  # this step's tree node budget (0 = a chain: a grammar's
    # forced tokens); None: the proposer's configured one

    def tree_budget(self, configured: int) -> int:
        return configured if self.tree_nodes is None else min(self.tree_nodes, configured)


@dataclass
class VerifiedRows:
    """What the target said at every row of a verify forward, for a proposer
    that drafts from the rows it fed (lookahead's Jacobi window, Fu et al. 2024).

    Row 0 is the last committed token; row i + 1 is draft node i (a chain is
    the tree whose node i hangs below node i - 1).
    """
    tokens: list[int]  # [N]: the fed drafts, node order
    parents: list[int]  # [N]: node i's parent, ROOT (-1) for a child of the fed token
    next_tokens: list[int]  # [N + 1]: the target's most likely token after each row,
    # from the request's processed logits
    committed: list[int]  # what the step committed (accepted drafts, then one more)


class HeldRows:
    """Target hidden rows a proposer was not called for, kept until it is.

    A proposer that reads the target's features (EAGLE) learns the context from
    every step's `target_hidden`. When a step skips it (adaptive k chose 0), the
    rows wait here and reach it in
    one call: one step's rows end where the next step's begin, so together they
    cover every position since its last call. Past `max_rows` the oldest are
    dropped, which leaves the proposer a gap (acceptance, never correctness).
    """

    def __init__(self, max_rows: int = 512) -> None:
        self.max_rows = max_rows
        self._parts: list[tuple[torch.Tensor, ...]] = []
        self._rows = 0

    def hold(self, hidden: tuple[torch.Tensor, ...]) -> None:
        if not hidden or hidden[0].shape[0] == 0:
            return
        self._parts.append(hidden)
        self._rows += hidden[0].shape[0]
        while self._rows - self._parts[0][0].shape[0] >= self.max_rows:
            self._rows -= self._parts.pop(0)[0].shape[0]

    def release(self, hidden: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """The held rows followed by this step's, and an empty hold."""
        if not self._parts:
            return hidden
        parts = self._parts + ([hidden] if hidden else [])
        self._parts, self._rows = [], 0
        return tuple(torch.cat(layer) for layer in zip(*parts))


@dataclass
class ProposerSetup:
    """Everything a factory may need to build a proposer for one request."""
    target: "TargetModel"
    spec: "SpecConfig"
    sampling: "SamplingParams"
    generator: torch.Generator
    resources: dict = field(default_factory=dict)  # engine-owned shared objects (loaded drafts)
    prediction: tuple[int, ...] = ()  # the request's predicted output (proposers.prediction)


class Proposer(ABC):
    name: str = "?"
    hidden_layers: tuple[int, ...] = ()  # target hidden states this proposer wants per step
    free: bool = False  # costs ~nothing and keeps no state, so it may be asked for shadow guesses
    drafts: bool = True  # False: never proposes, so a scheduler must not reserve draft positions

    @property
    def active(self) -> str:
        """The proposer behind the latest proposal, for stats (`auto` names its pick)."""
        return self.name

    @abstractmethod
    def propose(self, ctx: DraftContext, k: int) -> Proposal:
        """Up to k draft tokens continuing ctx.tokens."""

    def evidence(self, ctx: DraftContext) -> Evidence | None:
        """How well this proposer can guess at ctx, known before it drafts (n-gram
        lookup: its matched suffix length). The adaptive policy keeps acceptance
        per evidence key and picks k from the one at hand (verispec.policy.adaptive,
        "Evidence"). None: no such evidence."""
        return None

    # True: the engine calls verified() after every forward that fed drafts.
    reads_rows: bool = False

    def verified(self, rows: VerifiedRows) -> None:
        """The target's answer at every row this proposer's last draft fed (only
        when `reads_rows`)."""

    def finished(self, ctx: DraftContext) -> None:
        """The request ended (EOS, a stop string or its length) with ctx.tokens
        committed: a proposer that learns across requests (suffix) keeps its output."""


ProposerFactory = Callable[[ProposerSetup], Proposer]
_REGISTRY: dict[str, ProposerFactory] = {}


def register(name: str) -> Callable[[ProposerFactory], ProposerFactory]:
    def wrap(factory: ProposerFactory) -> ProposerFactory:
        _REGISTRY[name] = factory
        return factory
    return wrap


def available() -> list[str]:
    return sorted(_REGISTRY)


def build(setup: ProposerSetup) -> Proposer:
    name = setup.spec.proposer
    if name not in _REGISTRY:
        raise ValueError(f"unknown proposer {name!r}; choose one of {', '.join(available())}")
    return _REGISTRY[name](setup)
