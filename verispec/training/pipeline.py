"""`verispec train-head` end to end: responses -> features -> training -> head.

Output directory layout (everything a resume needs stays inside it):

    config.json, head.safetensors   the head (verispec.proposers.heads.format)
    loss.png, history.json          the loss curve and its numbers
    checkpoint.pt                   module, optimizer and RNG state of the last checkpoint
    data/responses.jsonl            the target's responses (phase 1 cache)
    data/features-L.../shard-*.safetensors   teacher-forced features (phase 2 cache)

`--data DIR` points phases 1-2 elsewhere, so an EAGLE and a Medusa head can
share one set of responses and features.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from verispec.models.base import TargetModel
from verispec.proposers.heads.format import HeadConfig, new_config, save_head
from verispec.proposers.heads.target_parts import describe_target, target_parts
from verispec.training.features import SequenceData, compute_features, features_dir, load_sequences
from verispec.training.responses import (
    GenerationSettings,
    PromptIds,
    generate_responses,
    read_samples,
)
from verispec.training.trainer import CHECKPOINT, HeadTrainer, History, TrainSettings


@dataclass
class PipelineSettings:
    kind: str  # "eagle" or "medusa"
    out: Path
    generation: GenerationSettings = field(default_factory=GenerationSettings)
    train: TrainSettings = field(default_factory=TrainSettings)
    data: Path | None = None  # default: out / "data"
    extra_data: tuple[Path, ...] = ()  # other runs' data dirs, trained on as well
    self_prompts: float = 0.0  # share of the prompts the target wrote itself (recorded in meta)
    data_topk: int = 32  # target probabilities stored per position
    fused: bool = False  # EAGLE-3-style input from low, middle and high target layers
    draft_vocab: int = 0  # keep the most frequent tokens only; 0 = full vocabulary
    num_medusa: int = 4
    medusa_layers: int = 1
    resume: bool = False
    init: Path | None = None  # start from this head's weights and draft vocabulary (fine-tuning)
    export: Path | None = None  # also copy the finished head files here
    progress: bool = True


@dataclass
class TrainResult:
    config: HeadConfig
    folder: Path
    history: History
    plot: Path | None
    module: torch.nn.Module  # the trained head in float32, before the bf16 rounding of the file
    draft_vocab: torch.Tensor | None


def fused_layers(num_layers: int) -> list[int]:
    """Low, middle and high layers, after EAGLE-3's choice (Li et al. 2025)."""
    return sorted({min(2, num_layers), max(1, num_layers // 2), max(1, num_layers - 3)})


def choose_draft_vocab(sequences: Sequence[SequenceData], size: int, vocab_size: int,
                       always: Sequence[int]) -> torch.Tensor | None:
    """The `size` tokens the target writes or ranks first most often, plus `always`."""
    if not size or size >= vocab_size:
        return None
    counts = torch.zeros(vocab_size)
    for seq in sequences:
        counts.index_add_(0, seq.tokens, torch.ones(len(seq.tokens)))
        counts.index_add_(0, seq.topk_ids[:, 0], torch.ones(len(seq.tokens)))
    counts[torch.tensor(list(always), dtype=torch.long)] = float("inf")
    # Ties break by token id (stable sort), so the choice is reproducible.
    order = torch.sort(-counts, stable=True).indices[:size]
    return torch.sort(order).values


def _bar(enabled: bool, **kwargs):
    from tqdm.auto import tqdm

    return tqdm(disable=not enabled, dynamic_ncols=True, **kwargs)


def _check_data_meta(folder: Path, meta: dict) -> None:
    path = folder / "meta.json"
    if path.exists():
        old = json.loads(path.read_text())
        if old != meta:
            raise ValueError(f"{folder} holds responses made with other settings "
                             f"({path}: {old}); use another --data dir")
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(meta, indent=2))


def check_data_dir(target: TargetModel, settings: PipelineSettings) -> Path:
    """The data dir, claimed for these generation settings; one holding responses
    made otherwise is a clear error, raised before any work."""
    data = settings.data or settings.out / "data"
    gen = settings.generation
    meta = {"target": target.weights_fingerprint(), "seed": gen.seed,
            "max_new_tokens": gen.max_new_tokens, "temperature": gen.temperature,
            "sample_fraction": gen.sample_fraction}
    if settings.self_prompts:
        meta["self_prompts"] = settings.self_prompts  # absent from caches made before the option
    _check_data_meta(data, meta)
    return data


def prepare_data(target: TargetModel, prompts: Sequence[PromptIds], settings: PipelineSettings,
                 layers: Sequence[int]) -> list[SequenceData]:
    data = check_data_dir(target, settings)
    gen = settings.generation
    fits = [p for p in prompts if len(p.tokens) + gen.max_new_tokens <= target.max_context]
    with _bar(settings.progress, total=gen.token_budget, desc="responses", unit="tok") as bar:
        samples = generate_responses(target, fits, data / "responses.jsonl", gen,
                                     progress=bar.update)
    if not samples:
        raise ValueError("no training prompt fits the target's context")
    with _bar(settings.progress, total=sum(len(s.tokens) for s in samples), desc="features",
              unit="tok") as bar:
        shards = compute_features(target, samples, features_dir(data, layers, settings.data_topk),
                                  layers, settings.data_topk, progress=bar.update)
    sequences = load_sequences(shards, layers)
    for extra in settings.extra_data:
        sequences += _extra_sequences(target, extra, settings, layers)
    return sequences


def _extra_sequences(target: TargetModel, folder: Path, settings: PipelineSettings,
                     layers: Sequence[int]) -> list[SequenceData]:
    """Another run's data dir (`--extra-data`): its cached responses, with features
    for these layers computed once if that run kept other layers."""
    meta = folder / "meta.json"
    samples = read_samples(folder / "responses.jsonl")
    if not meta.exists() or not samples:
        raise ValueError(f"--extra-data {folder}: no cached responses there "
                         "(a train-head run's --data dir holds meta.json and responses.jsonl)")
    made_on = json.loads(meta.read_text()).get("target")
    if made_on != target.weights_fingerprint():
        raise ValueError(f"--extra-data {folder} holds responses of other weights "
                         f"({made_on}; this target is {target.weights_fingerprint()})")
    with _bar(settings.progress, total=sum(len(s.tokens) for s in samples),
              desc=f"features {folder.name}", unit="tok") as bar:
        shards = compute_features(target, samples, features_dir(folder, layers, settings.data_topk),
                                  layers, settings.data_topk, progress=bar.update)
    return load_sequences(shards, layers)


def run_pipeline(target: TargetModel, prompts: Sequence[PromptIds], settings: PipelineSettings,
                 fingerprints: Sequence[str] = (), target_name: str | None = None,
                 command: str = "") -> TrainResult:
    out = settings.out
    out.mkdir(parents=True, exist_ok=True)
    if (out / CHECKPOINT).exists() and not settings.resume:
        raise ValueError(f"{out} already has a checkpoint: pass --resume to continue it, "
                         "or choose another --out")
    info = describe_target(target)
    feature_layers = fused_layers(info.num_layers) if settings.fused else [info.num_layers]
    config = new_config(settings.kind, info, [target.weights_fingerprint(), *fingerprints],
                        target_name or target.name, feature_layers, settings.num_medusa,
                        settings.medusa_layers, settings.draft_vocab)
    layers = sorted(set(feature_layers) | {info.num_layers})
    init = _initial_head(settings.init, config, target) if settings.init else None
    sequences = prepare_data(target, prompts, settings, layers)
    if init is not None:
        # The head's outputs are scored over its own draft vocabulary; keep it.
        draft_vocab = init.draft_vocab
    else:
        draft_vocab = choose_draft_vocab(sequences, settings.draft_vocab, info.vocab_size,
                                         sorted(target.eos_token_ids))
    config.draft_vocab_size = 0 if draft_vocab is None else int(draft_vocab.numel())
    trainer = HeadTrainer(config, target_parts(target), sequences, settings.train, draft_vocab)
    if settings.resume and (out / CHECKPOINT).exists():
        trainer.load_checkpoint(out)
    elif init is not None:
        trainer.module.load_state_dict({k: v.float() for k, v in init.state.items()})
    train = settings.train
    with _bar(settings.progress, total=train.steps, initial=trainer.step,
              desc=f"train {settings.kind}", unit="step") as bar:
        try:
            while trainer.step < train.steps:
                stats = trainer.train_step()
                bar.update(1)
                bar.set_postfix(loss=f"{stats.loss.item():.3f}", top1=f"{stats.top1:.2f}")
                if trainer.step % train.checkpoint_every == 0:
                    trainer.save_checkpoint(out)
        except KeyboardInterrupt:
            trainer.save_checkpoint(out)
            bar.write(f"interrupted at step {trainer.step}; checkpoint saved in {out}; "
                      "rerun the same command with --resume to continue")
            raise
    trainer.save_checkpoint(out)
    config.training = {
        "command": command, "steps": trainer.step, "sequences": len(sequences),
        "init": str(settings.init) if settings.init else None,
        "extra_data": [str(d) for d in settings.extra_data],
        "self_prompts": settings.self_prompts,
        "positions": sum(len(s.tokens) for s in sequences),
        "response_tokens": sum(len(s.tokens) - s.num_prompt for s in sequences),
        "settings": asdict(train), "generation": asdict(settings.generation),
        "final_loss": _tail_mean(trainer.history.loss),
        "final_top1": _tail_mean(trainer.history.top1),
    }
    save_head(out, config, trainer.module.state_dict(), draft_vocab)
    (out / "history.json").write_text(json.dumps(asdict(trainer.history)))
    plot = plot_history(trainer.history, out / "loss.png",
                        f"{settings.kind} head for {config.target_name}")
    if settings.export:
        settings.export.mkdir(parents=True, exist_ok=True)
        for name in ("config.json", "head.safetensors", "loss.png"):
            if (out / name).exists():
                shutil.copy2(out / name, settings.export / name)
    return TrainResult(config, out, trainer.history, plot, trainer.module.eval(), draft_vocab)


# Fields of a head's shape: a head to fine-tune from must match the new one in all of them.
_SHAPE_FIELDS = ("type", "hidden_size", "vocab_size", "num_target_layers", "feature_layers",
                 "num_heads", "num_kv_heads", "head_dim", "intermediate_size", "num_medusa",
                 "medusa_layers")


def _initial_head(folder: Path, config: HeadConfig, target: TargetModel):
    """The head `--init` names, checked against the target and the head being trained."""
    from verispec.proposers.heads.format import check_target, read_head

    stored = read_head(folder)
    check_target(stored.config, target, where=f"--init {folder}")
    differ = [f"{name} {getattr(stored.config, name)} != {getattr(config, name)}"
              for name in _SHAPE_FIELDS if getattr(stored.config, name) != getattr(config, name)]
    if differ:
        raise ValueError(f"--init {folder} is not shaped like the head being trained: "
                         + "; ".join(differ) + " (match --type, --fused and --medusa-heads)")
    return stored


def _tail_mean(values: Sequence[float], window: int = 50) -> float | None:
    tail = list(values)[-window:]
    return round(sum(tail) / len(tail), 4) if tail else None


def _smooth(values: Sequence[float], window: int) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def plot_history(history: History, path: Path, title: str) -> Path | None:
    if not history.steps:
        return None
    from verispec.bench.plots import plt, save_figure

    window = max(1, len(history.steps) // 50)
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.5, 3.6))
    left.plot(history.steps, history.loss, color="lightgrey", lw=0.8, label="total, per step")
    left.plot(history.steps, _smooth(history.loss, window), label=f"total, mean of {window} steps")
    if any(history.regression):
        left.plot(history.steps, _smooth(history.regression, window), lw=1,
                  label="feature (smooth L1)")
    left.plot(history.steps, _smooth(history.distill, window), lw=1,
              label="distillation (cross-entropy)")
    left.set_xlabel("step")
    left.set_ylabel("loss")
    left.set_yscale("log")
    left.legend(fontsize=7)
    right.plot(history.steps, _smooth(history.top1, window))
    right.set_xlabel("step")
    right.set_ylabel("draft top-1 = target top-1 (first draft)")
    right.set_ylim(0, 1)
    fig.suptitle(title, fontsize=9)
    return save_figure(fig, path)
