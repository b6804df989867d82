"""Target backend over any `transformers` causal LM."""
from __future__ import annotations

import copy
import hashlib
import inspect
from typing import Sequence

import torch
from transformers import PreTrainedModel

from .base import ForwardOutput, TargetModel
from .hf_cache import DEFAULT_SLACK, HFCache, window_masks
from .llama_weights import _digest_part


def _cache_kwarg(model: PreTrainedModel) -> str:
    # transformers 5.x renamed past_key_values to cache; take whichever forward accepts.
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class HFModel(TargetModel):
    def __init__(self, model: PreTrainedModel, name: str = "hf",
                 window_slack: int = DEFAULT_SLACK) -> None:
        """`window_slack`: positions a sliding-window layer keeps past its window,
        the deepest rollback it supports (see `hf_cache`)."""
        self.model = model.eval()
        self.window_slack = int(window_slack)
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
        # sdpa reads a bool mask as True = attend; eager attention (Gemma 2's softcapping,
        # for one) adds the mask to the scores, so it needs 0 / -inf.
        self._additive_masks = getattr(cfg, "_attn_implementation", "sdpa") != "sdpa"
        if self.dtype in (torch.bfloat16, torch.float16):
            _fp32_head(model.get_output_embeddings())

    def new_cache(self, capacity: int | None = None) -> HFCache:
        return HFCache(self.config, self.window_slack)

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
        cache.before_forward()
        start = cache.length
        if positions is None:
            positions = torch.arange(start, start + n, device=self.device)
        positions = positions.to(self.device)
        if mask is not None:
            mask = mask.to(self.device)
        windowed = window_masks(cache, positions, mask)
        kwargs = {
            self._cache_kw: cache.kv,
            "use_cache": True,
            "position_ids": positions[None],
            "logits_to_keep": num_logits or 0,
            "output_hidden_states": bool(hidden_layers),
        }
        if windowed is not None:
            kwargs["attention_mask"] = windowed
        elif mask is not None:
            kwargs["attention_mask"] = mask[None, None]  # [1, 1, n, start + n]
        if self._additive_masks and "attention_mask" in kwargs:
            kwargs["attention_mask"] = _additive(kwargs["attention_mask"], self.dtype)
        out = self.model(input_ids=tokens[None].to(self.device), **kwargs)
        hidden = tuple(out.hidden_states[layer][0] for layer in hidden_layers) if hidden_layers else ()
        return ForwardOutput(logits=out.logits[0].float(), hidden=hidden)

    def truncated(self, num_layers: int) -> "HFModel":
        """The first `num_layers` decoder layers plus the final norm and LM head,
        sharing this model's parameters (a layer-skip self-draft, no extra weights)."""
        if not 1 <= num_layers <= self.num_layers:
            raise ValueError(
                f"self:L needs 1 <= L <= {self.num_layers} for {self.name}, got {num_layers}")
        cfg = copy.deepcopy(self.config)
        cfg.num_hidden_layers = num_layers
        for key in ("layer_types",):
            if isinstance(getattr(cfg, key, None), list):
                setattr(cfg, key, getattr(cfg, key)[:num_layers])
        shallow = _copy_along(self.model, _decoder_layers_path(self.model, self.num_layers),
                              num_layers, cfg)
        if getattr(self.model, "generation_config", None) is not None:
            shallow.generation_config = copy.deepcopy(self.model.generation_config)
        return HFModel(shallow, name=f"{self.name}[:{num_layers}]", window_slack=self.window_slack)

    def weights_fingerprint(self) -> str:
        digest = hashlib.sha256()
        for key, tensor in sorted(self.model.state_dict().items()):
            digest.update(key.encode())
            digest.update(_digest_part(tensor))
        return digest.hexdigest()[:16]


def _decoder_layers_path(model: PreTrainedModel, num_layers: int) -> list[str]:
    """Attribute names from the model to its decoder layers' ModuleList: model.layers
    (Llama family), transformer.h (GPT-2, Falcon), model.decoder.layers (OPT)."""
    found = [name for name, module in model.named_modules()
             if isinstance(module, torch.nn.ModuleList) and len(module) == num_layers]
    if not found:
        raise ValueError(f"cannot find {type(model).__name__}'s {num_layers} decoder layers "
                         "for a layer-skip draft")
    return min(found, key=lambda name: name.count(".")).split(".")


def _copy_along(model: torch.nn.Module, path: list[str], num_layers: int, cfg) -> torch.nn.Module:
    """Shallow copies of the modules on `path`, the last one's list cut to its first
    `num_layers`: everything else, parameters included, is shared with `model`."""
    top = copy.copy(model)
    parent = top
    for name in path[:-1]:
        # nn.Module keeps submodules in _modules; copy that dict so each swap stays local.
        parent._modules = dict(parent._modules)
        child = copy.copy(parent._modules[name])
        parent._modules[name] = child
        parent = child
    parent._modules = dict(parent._modules)
    parent._modules[path[-1]] = torch.nn.ModuleList(list(parent._modules[path[-1]])[:num_layers])
    node = top
    for name in [None, *path[:-1]]:
        node = node if name is None else node._modules[name]
        if hasattr(node, "config"):
            node.config = cfg
    return top


# An fp32 copy of the head is kept only up to this size; a larger head (an 8B model's
# 128k x 4096 is 2 GB in fp32) is cast slice by slice on every forward instead, so the
# extra memory stays bounded whatever the model.
FP32_HEAD_BYTES = 256 << 20


def _fp32_head(head: torch.nn.Module) -> None:
    """Compute a half-precision model's LM head in fp32, from the same half-precision
    hidden state. bf16 logits of magnitude 16-32 are 0.125 apart, coarser than the
    law's 0.1 near-tie bound, so two candidates a hair apart would round to a gap
    the law cannot excuse; fp32 logits keep the gap the hidden state really implies.
    Plain and speculative decoding share this head, so both see the same model. Any
    later logit step (Gemma 2's soft-capping) then runs in fp32 as well. The module's
    own forward is replaced, not hooked, so the half-precision head never runs."""
    if getattr(head, "_verispec_fp32", False):  # a layer-skip draft shares the head
        return
    weight, bias = head.weight, getattr(head, "bias", None)
    rows = max(1, FP32_HEAD_BYTES // (4 * weight.shape[1]))
    kept: dict[str, torch.Tensor | None] = {}

    def fp32_forward(hidden: torch.Tensor) -> torch.Tensor:
        x = hidden.float()
        if rows >= weight.shape[0]:
            if "weight" not in kept:
                kept["weight"] = weight.detach().float()
                kept["bias"] = None if bias is None else bias.detach().float()
            return torch.nn.functional.linear(x, kept["weight"], kept["bias"])
        return torch.cat([torch.nn.functional.linear(
            x, weight[i:i + rows].float(), None if bias is None else bias[i:i + rows].float())
            for i in range(0, weight.shape[0], rows)], dim=-1)

    head.forward = fp32_forward
    head._verispec_fp32 = True


def _additive(mask, dtype: torch.dtype):
    """A bool mask (or a dict of them by layer type) as scores to add: 0 or the dtype's min."""
    if isinstance(mask, dict):
        return {kind: _additive(m, dtype) for kind, m in mask.items()}
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(mask, zero, torch.finfo(dtype).min)


def _eos_ids(model: PreTrainedModel) -> set[int]:
    ids: set[int] = set()
    for source in (model.config, getattr(model, "generation_config", None)):
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(eos, int):
            ids.add(eos)
        elif eos:
            ids.update(int(e) for e in eos)
    return ids
