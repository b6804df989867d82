"""The target-model protocol every backend implements.

A model owns nothing per request: each request holds a cache made by
`new_cache()`, and `forward` appends to it. The engine keeps one invariant:
after every step, `cache.length` equals the number of committed tokens whose
keys and values are stored, so rollback is `cache.truncate(n)`.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Protocol, Sequence

import torch


class KVCache(Protocol):
    """Per-request key/value store. Rollback moves a length pointer."""

    @property
    def length(self) -> int: ...

    def truncate(self, length: int) -> None:
        """Forget every position >= length. A no-op when length >= self.length."""


@dataclass
class BatchItem:
    """One request's share of a batched forward: exactly the arguments of `forward`."""
    tokens: torch.Tensor  # [n] int64
    cache: "KVCache"  # the request's own cache; only it is read and appended to
    positions: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    num_logits: int | None = None
    hidden_layers: Sequence[int] = ()


@dataclass
class ForwardOutput:
    logits: torch.Tensor  # [num_logits, vocab], float32, for the last num_logits positions
    hidden: tuple[torch.Tensor, ...] = ()  # one [n, hidden_size] per requested layer
    # [1 + n] int64 on the model's device, from a target that computes it with the
    # forward (static_llama): how many of tokens[1:] equal the argmax of the row
    # before them (a chain's accepted drafts), then every row's argmax (first index
    # on ties). One read of it is a greedy step's one host sync.
    greedy: torch.Tensor | None = None


class TargetModel(ABC):
    """A causal LM seen as token ids in, logits out."""

    vocab_size: int  # rows of the LM head; token ids are < vocab_size
    max_context: int  # positions the model supports; prompt + output must fit
    eos_token_ids: frozenset[int]  # any of these ends generation (unless ignore_eos)
    num_layers: int  # decoder layers; hidden layer l is the output of layer l, 0 = embeddings
    hidden_size: int
    dtype: torch.dtype
    device: torch.device
    name: str  # for stats and error messages
    fuses_batches: bool = False  # forward_batch runs its items' rows together, not in turn

    @abstractmethod
    def new_cache(self, capacity: int | None = None) -> KVCache:
        """An empty cache for one request; `capacity` is a hint of the most
        positions it will hold (static caches size their buffers by it)."""

    @abstractmethod
    def forward(
        self,
        tokens: torch.Tensor,  # [n] int64, the new positions
        cache: KVCache,
        positions: torch.Tensor | None = None,  # [n]; default cache.length + arange(n)
        mask: torch.Tensor | None = None,  # [n, cache.length + n] bool, True = may attend
        num_logits: int | None = None,  # logits for the last num_logits positions; None = all n
        hidden_layers: Sequence[int] = (),  # which hidden states to return
    ) -> ForwardOutput:
        """Run n new positions against the cached context and append them to it."""

    def forward_batch(self, items: Sequence[BatchItem]) -> list[ForwardOutput]:
        """Several requests, each with its own cache and row count, in one call.

        Contract: item i's output is what `forward(**item i)` alone returns, so a
        request's greedy output cannot depend on what shares its batch. This
        default runs them one after another; backends that can fuse rows (the
        native one) override it.
        """
        return [self.forward(item.tokens, item.cache, item.positions, item.mask,
                             item.num_logits, item.hidden_layers) for item in items]

    def weights_fingerprint(self) -> str:
        """A short, stable identity for the weights (used to match trained heads)."""
        return self.name
