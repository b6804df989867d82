"""Tiny heads for the head suites: briefly trained ones (memoized per process,
so test_heads.py and test_head_equality.py share one training run) and
random-init ones that should get next to nothing accepted."""
from __future__ import annotations

import functools
import random
from pathlib import Path

import torch

from verispec.proposers.heads import build_module, save_head
from verispec.proposers.heads.format import new_config
from verispec.proposers.heads.target_parts import describe_target
from verispec.training.pipeline import PipelineSettings, TrainResult, run_pipeline
from verispec.training.responses import GenerationSettings, PromptIds
from verispec.training.trainer import TrainSettings


def tiny_prompts(vocab: int, count: int = 24, seed: int = 0) -> list[PromptIds]:
    rng = random.Random(seed)
    return [PromptIds(f"p{i}", "chat", [rng.randrange(vocab) for _ in range(rng.randint(3, 16))])
            for i in range(count)]


def tiny_settings(kind: str, out: Path, data: Path, steps: int = 60, fused: bool = False,
                  draft_vocab: int = 0, resume: bool = False) -> PipelineSettings:
    return PipelineSettings(
        kind=kind, out=out, data=data,
        generation=GenerationSettings(max_new_tokens=40, token_budget=600, sample_fraction=0.3,
                                      temperature=1.0),
        train=TrainSettings(steps=steps, batch_size=4, max_len=64, lr=1e-2 if kind == "medusa" else 3e-3,
                            warmup=5, unroll=2,
                            topk=8, negatives=32, checkpoint_every=8),
        data_topk=8, fused=fused, draft_vocab=draft_vocab, resume=resume, progress=False)


def trained(root: Path, target, kind: str, fused: bool = False) -> TrainResult:
    """A head trained for 60 steps on the target's answers to 24 random prompts.
    The fused EAGLE one also drafts from a reduced vocabulary."""
    return _trained(root, target, kind, fused)


@functools.lru_cache(maxsize=None)  # one key per head, however the caller spells the arguments
def _trained(root: Path, target, kind: str, fused: bool) -> TrainResult:
    name = f"{kind}{'-fused' if fused else ''}"
    settings = tiny_settings(kind, root / name, root / "data", fused=fused,
                             draft_vocab=target.vocab_size // 2 if fused else 0)
    return run_pipeline(target, tiny_prompts(target.vocab_size), settings)


def random_head(folder: Path, kind: str, target, seed: int = 0, fused: bool = False) -> Path:
    """An untrained head: random EAGLE layer, or random (not zero) Medusa blocks."""
    info = describe_target(target)
    layers = [1, info.num_layers] if fused else None
    config = new_config(kind, info, [target.weights_fingerprint()], target.name, layers)
    torch.manual_seed(seed)
    module = build_module(config)
    if kind == "medusa":
        module.randomize(torch.Generator().manual_seed(seed), scale=2.0)
    save_head(folder, config, module.state_dict())
    return folder
