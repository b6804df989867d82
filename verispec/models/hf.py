"""Target backend over any `transformers` causal LM."""
from __future__ import annotations

import copy
import hashlib
import inspect
from typing import Sequence

import torch
from transformers import DynamicCache, PreTrainedModel

from .base import ForwardOutput, TargetModel


class HFCache:
    """A DynamicCache whose rollback is a crop to an absolute length."""

    def __init__(self, config) -> None:
        self.kv = DynamicCache(config=config)

    @property
    def length(self) -> int:
        return self.kv.get_seq_length()

    def truncate(self, length: int) -> None:
        extra = self.length - length
        if extra > 0:
            # A negative argument removes that many positions in every transformers
            # release that has crop(); a positive one means different things across them.
            self.kv.crop(-extra)

    @torch.inference_mode()
    def compact(self, start: int, keep: torch.Tensor) -> None:
        """Keep positions [0, start) and then the positions in `keep`, in order.

        `keep` holds absolute positions, strictly increasing, all in [start,
        length). Afterwards position start + j holds what keep[j] held and
        length == start + len(keep): the contract of StaticKVCache.compact.

        Tree verification calls this once a path is accepted: the path's nodes
        were forwarded at RoPE positions start + depth, so the compacted cache
        equals one built by forwarding the kept tokens alone as a chain.
        """
        keep = keep.flatten().to(torch.long)
        length = self.length
        count = keep.numel()
        if not 0 <= start <= length:
            raise ValueError(f"compact start {start} outside the cached range [0, {length}]")
        if count:
            lo, hi = int(keep[0]), int(keep[-1])
            if lo < start or hi >= length:
                raise ValueError(f"compact keeps positions in [{lo}, {hi}], outside [{start}, {length})")
            if count > 1 and not bool((keep[1:] > keep[:-1]).all()):
                raise ValueError("compact needs strictly increasing positions")
        layers = [layer for layer in self.kv.layers if layer.is_initialized]
        if any(getattr(layer, "is_sliding", False) for layer in layers):
            # A sliding layer stores a window, not absolute positions; checked before any write.
            raise NotImplementedError("compacting a sliding-window cache layer is not supported")
        if count and int(keep[-1]) - int(keep[0]) == count - 1 and int(keep[0]) == start:
            self.truncate(start + count)
            return
        for layer in layers:
            index = keep.to(layer.keys.device)
            # Advanced indexing gathers into a fresh tensor before the write, so
            # sources the write overlaps are read first.
            layer.keys[..., start:start + count, :] = layer.keys[..., index, :]
            layer.values[..., start:start + count, :] = layer.values[..., index, :]
            layer.keys = layer.keys[..., : start + count, :]
            layer.values = layer.values[..., : start + count, :]


def _cache_kwarg(model: PreTrainedModel) -> str:
    # transformers 5.x renamed past_key_values to cache; take whichever forward accepts.
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class HFModel(TargetModel):
    def __init__(self, model: PreTrainedModel, name: str = "hf") -> None:
        self.model = model.eval()
        cfg = model.config
        self.config = cfg
        self.name = name
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.max_context = int(getattr(cfg, "max_position_embeddings", 2048))
        self.num_layers = int(cfg.num_hidden_layers)
        self.hidden_size = int(cfg.hidden_size)
        self.dtype = next(model.parameters()).dtype
        self.device = next(model.parameters()).device
        self.eos_token_ids = frozenset(_eos_ids(model))
        self._cache_kw = _cache_kwarg(model)

    def new_cache(self, capacity: int | None = None) -> HFCache:
        return HFCache(self.config)

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,
        cache: HFCache,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        num_logits: int | None = None,
        hidden_layers: Sequence[int] = (),
    ) -> ForwardOutput:
        n = tokens.shape[0]
        start = cache.length
        if positions is None:
            positions = torch.arange(start, start + n, device=self.device)
        kwargs = {
            self._cache_kw: cache.kv,
            "use_cache": True,
            "position_ids": positions[None].to(self.device),
            "logits_to_keep": num_logits or 0,
            "output_hidden_states": bool(hidden_layers),
        }
        if mask is not None:
            kwargs["attention_mask"] = mask[None, None].to(self.device)  # [1, 1, n, start + n]
        out = self.model(input_ids=tokens[None].to(self.device), **kwargs)
        hidden = tuple(out.hidden_states[layer][0] for layer in hidden_layers) if hidden_layers else ()
        return ForwardOutput(logits=out.logits[0].float(), hidden=hidden)

    def truncated(self, num_layers: int) -> "HFModel":
        """The first `num_layers` decoder layers plus the final norm and LM head,
        sharing this model's parameters (a layer-skip self-draft, no extra weights)."""
        if not 1 <= num_layers <= self.num_layers:
            raise ValueError(
                f"self:L needs 1 <= L <= {self.num_layers} for {self.name}, got {num_layers}")
        base = self.model.base_model
        shallow = copy.copy(self.model)
        shallow_base = copy.copy(base)
        # nn.Module keeps submodules in _modules; copy that dict so the swap stays local.
        shallow._modules = dict(self.model._modules)
        shallow_base._modules = dict(base._modules)
        shallow_base.layers = torch.nn.ModuleList(list(base.layers)[:num_layers])
        cfg = copy.deepcopy(self.config)
        cfg.num_hidden_layers = num_layers
        for key in ("layer_types",):
            if isinstance(getattr(cfg, key, None), list):
                setattr(cfg, key, getattr(cfg, key)[:num_layers])
        shallow_base.config = cfg
        shallow.config = cfg
        if getattr(self.model, "generation_config", None) is not None:
            shallow.generation_config = copy.deepcopy(self.model.generation_config)
        shallow._modules[self.model.base_model_prefix] = shallow_base
        return HFModel(shallow, name=f"{self.name}[:{num_layers}]")

    def weights_fingerprint(self) -> str:
        digest = hashlib.sha256()
        for key, tensor in sorted(self.model.state_dict().items()):
            digest.update(key.encode())
            flat = tensor.detach().float().flatten()
            digest.update(flat[:: max(1, flat.numel() // 64)][:64].numpy().tobytes())
        return digest.hexdigest()[:16]


def _eos_ids(model: PreTrainedModel) -> set[int]:
    ids: set[int] = set()
    for source in (model.config, getattr(model, "generation_config", None)):
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(eos, int):
            ids.add(eos)
        elif eos:
            ids.update(int(e) for e in eos)
    return ids
