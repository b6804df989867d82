"""Proposers register themselves on import; `build` picks one by name."""
from verispec.proposers import auto, draft, eagle, lookahead, medusa, ngram, none, suffix  # noqa: F401  (registration side effects)
from verispec.proposers.base import (
    DraftContext,
    Proposal,
    Proposer,
    ProposerSetup,
    available,
    build,
    register,
)

__all__ = ["DraftContext", "Proposal", "Proposer", "ProposerSetup", "available", "build", "register"]
