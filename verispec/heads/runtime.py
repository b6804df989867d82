"""A head bound to a loaded target, ready to draft: its own module in the
target's dtype, the target's shared parts, and the output layer it drafts
through (the full LM head, or the rows of a reduced draft vocabulary).

Loaded modules are cached per file, dtype and device, so a server building a
proposer per request reads the file once; the target check runs every time.
"""
from __future__ import annotations

import weakref
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..models.base import TargetModel
from .eagle import EagleHead
from .format import HeadConfig, check_target, find_shipped, read_head
from .medusa import MedusaHead
from .target_parts import TargetParts, target_parts

_CACHE_SIZE = 8
_LOADED: "OrderedDict[tuple, tuple[HeadConfig, nn.Module, torch.Tensor | None]]" = OrderedDict()


def build_module(config: HeadConfig) -> nn.Module:
    return EagleHead(config) if config.type == "eagle" else MedusaHead(config)


class DraftOutput:
    """Logits of the draft distribution and their mapping back to the target's
    vocabulary. A reduced draft vocabulary (EAGLE-3's, Li et al. 2025) keeps
    the most frequent tokens only: the per-token LM-head cost, which dominates
    a small target's draft step, shrinks in proportion. Tokens outside it get
    draft probability 0, which rejection sampling handles like any other draft
    distribution, so the output stays exact."""

    def __init__(self, parts: TargetParts, draft_vocab: torch.Tensor | None, vocab_size: int,
                 limit: int = 0, owner: object | None = None) -> None:
        self.parts = parts
        self.vocab_size = vocab_size
        if limit and limit < (vocab_size if draft_vocab is None else draft_vocab.numel()):
            # One draft token's LM-head product reads every row of the draft vocabulary,
            # as much memory as the head's layer. BPE numbers tokens in merge order, so
            # the lowest ids are the frequent ones, so a cut keeps most of the acceptance
            # (measured in docs/notebook/redesign.md).
            ids = torch.arange(vocab_size) if draft_vocab is None else draft_vocab
            draft_vocab = torch.sort(ids).values[:limit]
        self.ids = None if draft_vocab is None else draft_vocab.to(parts.device, torch.long)
        self._linear = None
        if self.ids is not None:
            self._linear = _draft_rows(parts, self.ids, owner)

    @property
    def size(self) -> int:
        return self.vocab_size if self.ids is None else int(self.ids.numel())

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """[rows, hidden] -> [rows, size] float32."""
        if self._linear is None:
            return self.parts.lm_head(x).float()
        return self._linear(x).float()

    def token_ids(self, index: torch.Tensor) -> torch.Tensor:
        return index if self.ids is None else self.ids[index.to(self.ids.device)]

    def full(self, probs: torch.Tensor) -> torch.Tensor:
        """[rows, size] -> [rows, vocab]: draft probabilities on the target's vocabulary."""
        if self.ids is None:
            return probs
        out = probs.new_zeros(probs.shape[0], self.vocab_size)
        out[:, self.ids] = probs
        return out


# Per target, the draft-vocabulary LM-head rows of each id set in use: a server
# binds a head per request, and gathering (or re-reading) the rows each time costs.
_ROWS: "weakref.WeakKeyDictionary[object, dict[bytes, object]]" = weakref.WeakKeyDictionary()


def _draft_rows(parts: TargetParts, ids: torch.Tensor, owner: object | None):
    """A row subset of the shared LM head as one Linear: in the target's own GGUF
    blocks where it runs them (bit-identical logits, fewer bytes per draft token),
    else the dense rows."""
    from ..models.llama_weights import Linear

    def build():
        if parts.quant_rows is not None:
            return parts.quant_rows(ids)
        return Linear(parts.lm_rows(ids).to(parts.dtype).contiguous())

    if owner is None:
        return build()
    table = _ROWS.setdefault(owner, {})
    key = ids.cpu().numpy().tobytes()  # exact, and hashed in C rather than as 16k ints
    if key not in table:
        while len(table) >= _CACHE_SIZE:
            table.pop(next(iter(table)))
        table[key] = build()
    return table[key]


@dataclass
class LoadedHead:
    config: HeadConfig
    module: nn.Module  # EagleHead or MedusaHead, eval mode, in the target's dtype
    parts: TargetParts
    output: DraftOutput
    path: Path | None = None

    @property
    def hidden_layers(self) -> tuple[int, ...]:
        return tuple(self.config.feature_layers)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        # a host copy that does not wait for the device: the draft's tokens are already known
        return F.embedding(tokens.to(self.parts.device, non_blocking=True), self.parts.embed)


def bind(config: HeadConfig, module: nn.Module, draft_vocab: torch.Tensor | None,
         target: TargetModel, path: Path | None = None, vocab_limit: int = 0,
         quant: str | None = None) -> LoadedHead:
    """Attach a head module to the target whose weights it was trained on."""
    check_target(config, target, where=f"head {path}" if path else "the head")
    parts = target_parts(target)
    module = module.requires_grad_(False).to(device=target.device, dtype=target.dtype).eval()
    if quant is not None:
        if config.type != "eagle":
            raise ValueError(f"head_quant runs an EAGLE head's matrices in {quant}; "
                             f"this is a {config.type} head")
        module.pack(quant=quant)
    else:
        module.pack()
    return LoadedHead(config, module, parts,
                      DraftOutput(parts, draft_vocab, target.vocab_size, vocab_limit, target),
                      path)


def load_head(source: str | Path | None, kind: str, target: TargetModel,
              vocab_limit: int = 0, quant: str | None = None) -> LoadedHead:
    """A head directory, or None for the shipped head of `kind` for this target;
    `vocab_limit` > 0 drafts over that many of its draft tokens (DraftOutput)."""
    path = Path(source).expanduser() if source else find_shipped(kind, target)
    weights = path / "head.safetensors"
    key = (str(path.resolve()), weights.stat().st_mtime_ns if weights.exists() else 0,
           target.dtype, str(target.device))
    if key not in _LOADED:
        stored = read_head(path)
        module = build_module(stored.config)
        module.load_state_dict({k: v.float() for k, v in stored.state.items()})
        module = module.requires_grad_(False).to(device=target.device, dtype=target.dtype).eval()
        _LOADED[key] = (stored.config, module, stored.draft_vocab)
        while len(_LOADED) > _CACHE_SIZE:
            _LOADED.popitem(last=False)
    _LOADED.move_to_end(key)
    config, module, draft_vocab = _LOADED[key]
    if config.type != kind:
        raise ValueError(f"{path} holds a {config.type} head; proposer {kind!r} needs a {kind} head")
    return bind(config, module, draft_vocab, target, path, vocab_limit, quant)
