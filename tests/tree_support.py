"""Tree steps through the engine: a request whose proposer hands the engine the
trees a test scripts, so the test checks the engine's own tree step (feed,
forward, verify, compact) rather than a copy of it."""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from verispec.config import SamplingParams, SpecConfig
from verispec.metrics import Stats
from verispec.proposers.base import DraftContext, Proposal, Proposer
from verispec.request import SpecRequest
from verispec.step.stopping import Stopper
from verispec.step.token_tree import TokenTree


class ScriptedTrees(Proposer):
    """Proposes `script(committed tokens)`; `trees` keeps what it proposed."""
    name = "scripted"

    def __init__(self, script: Callable[[list[int]], TokenTree],
                 hidden_layers: Sequence[int] = ()) -> None:
        self.script = script
        self.hidden_layers = tuple(hidden_layers)
        self.trees: list[TokenTree] = []

    def propose(self, ctx: DraftContext, k: int) -> Proposal:
        tree = self.script(list(ctx.tokens))
        self.trees.append(tree)
        return Proposal(tree.tokens, tree=tree)


class Recorded(Proposer):
    """Another proposer, with every tree it proposed kept in `trees`."""

    def __init__(self, inner: Proposer) -> None:
        self.inner, self.name, self.hidden_layers = inner, inner.name, inner.hidden_layers
        self.trees: list[TokenTree] = []

    def propose(self, ctx: DraftContext, k: int) -> Proposal:
        proposal = self.inner.propose(ctx, k)
        self.trees.append(proposal.tree)
        return proposal


def tree_request(target, prompt: list[int], sampling: SamplingParams, proposer: Proposer,
                 k: int = 8, nodes: int = 64, seed: int = 1) -> SpecRequest:
    """A request at fixed draft depth k whose cache has room for `nodes`-node trees."""
    spec = SpecConfig("ngram", k=k, tree=nodes)
    stopper = Stopper(sampling, target.eos_token_ids, None)
    return SpecRequest(target, list(prompt), sampling, spec, proposer, stopper,
                       torch.Generator().manual_seed(seed), Stats(proposer=proposer.name, k=k))
