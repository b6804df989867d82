"""Phase 2 of head training: teacher-forced target features.

Each sample (prompt + the target's response) goes through the target once,
with `hidden_layers`, returning the hidden states the head reads and the
logits; only the top-k next-token probabilities are kept, which is what the
sparse distillation loss needs and keeps the data ~100x smaller than full
distributions. Shards are safetensors files of `shard_size` samples:

    tokens [N] int32, offsets [S + 1] int64, num_prompt [S] int64,
    hidden.<layer> [N, hidden] bf16, topk_ids [N, K] int32, topk_probs [N, K] fp16

Row t of a sample is the target at position t: hidden.<layer>[t] is the
state that predicted token t + 1, topk_* its distribution over token t + 1.
A shard is written once complete, so a resumed run recomputes at most one.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from verispec.models.base import TargetModel
from verispec.training.responses import Sample

SLICE = 256  # positions per forward: bounds the [rows, vocab] logits in memory


@dataclass
class SequenceData:
    tokens: torch.Tensor  # [T] int64
    num_prompt: int
    hidden: dict[int, torch.Tensor]  # layer -> [T, hidden] bf16
    topk_ids: torch.Tensor  # [T, K] int64
    topk_probs: torch.Tensor  # [T, K] float32


def features_dir(data_dir: Path, layers: Sequence[int], topk: int) -> Path:
    return data_dir / f"features-L{'-'.join(map(str, layers))}-top{topk}"


@torch.inference_mode()
def teacher_force(target: TargetModel, tokens: list[int], layers: Sequence[int],
                  topk: int) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    cache = target.new_cache(len(tokens))
    hidden: list[list[torch.Tensor]] = [[] for _ in layers]
    ids, probs = [], []
    for start in range(0, len(tokens), SLICE):
        piece = torch.tensor(tokens[start:start + SLICE])
        out = target.forward(piece, cache, hidden_layers=tuple(layers))
        for store, h in zip(hidden, out.hidden):
            store.append(h.to("cpu", torch.bfloat16))
        top = out.logits.float().softmax(-1).topk(topk, dim=-1)
        ids.append(top.indices.to("cpu", torch.int32))
        probs.append(top.values.to("cpu", torch.float16))
    return [torch.cat(h) for h in hidden], torch.cat(ids), torch.cat(probs)


def compute_features(target: TargetModel, samples: Sequence[Sample], folder: Path,
                     layers: Sequence[int], topk: int, shard_size: int = 64,
                     progress: Callable[[int], None] | None = None) -> list[Path]:
    """Write the shards `samples` need into `folder`, skipping complete ones."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    meta_path = folder / "meta.json"
    meta = {"layers": list(layers), "topk": topk, "shard_size": shard_size,
            "hidden_size": target.hidden_size, "fingerprint": target.weights_fingerprint()}
    if meta_path.exists() and json.loads(meta_path.read_text()) != meta:
        raise ValueError(f"{folder} holds features of another setup ({meta_path}); "
                         "use a new --data dir")
    meta_path.write_text(json.dumps(meta, indent=2))
    shards = []
    for index, start in enumerate(range(0, len(samples), shard_size)):
        group = samples[start:start + shard_size]
        path = folder / f"shard-{index:05d}.safetensors"
        shards.append(path)
        if path.exists() and _shard_count(path) == len(group):
            if progress:
                progress(sum(len(s.tokens) for s in group))
            continue
        tensors: dict[str, list[torch.Tensor]] = {"tokens": [], "topk_ids": [], "topk_probs": []}
        tensors.update({f"hidden.{layer}": [] for layer in layers})
        offsets = [0]
        for sample in group:
            hidden, ids, probs = teacher_force(target, sample.tokens, layers, topk)
            tensors["tokens"].append(torch.tensor(sample.tokens, dtype=torch.int32))
            for layer, h in zip(layers, hidden):
                tensors[f"hidden.{layer}"].append(h)
            tensors["topk_ids"].append(ids)
            tensors["topk_probs"].append(probs)
            offsets.append(offsets[-1] + len(sample.tokens))
            if progress:
                progress(len(sample.tokens))
        flat = {name: torch.cat(parts) for name, parts in tensors.items()}
        flat["offsets"] = torch.tensor(offsets, dtype=torch.int64)
        flat["num_prompt"] = torch.tensor([len(s.prompt) for s in group], dtype=torch.int64)
        tmp = path.with_suffix(".tmp")
        save_file(flat, str(tmp), metadata={"samples": str(len(group))})
        tmp.replace(path)
    return shards


def _shard_count(path: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as fh:
        return int((fh.metadata() or {}).get("samples", -1))


def load_sequences(shards: Sequence[Path], layers: Sequence[int]) -> list[SequenceData]:
    from safetensors.torch import load_file

    out = []
    for path in shards:
        data = load_file(str(path))
        offsets = data["offsets"].tolist()
        for i, (a, b) in enumerate(zip(offsets[:-1], offsets[1:])):
            out.append(SequenceData(
                tokens=data["tokens"][a:b].long(), num_prompt=int(data["num_prompt"][i]),
                hidden={layer: data[f"hidden.{layer}"][a:b] for layer in layers},
                topk_ids=data["topk_ids"][a:b].long(), topk_probs=data["topk_probs"][a:b].float()))
    return out
