"""Phase 3 of head training: fit an EAGLE or Medusa head to teacher-forced
target data (verispec.training.features), with a seeded batch order,
checkpoints that resume bit for bit, and a loss curve.

EAGLE (Li et al. 2024): row t reads (f_t, x_{t+1}) and is trained toward the
target's next feature f_{t+1} (smooth L1, weight reg_weight) and the target's
distribution over token t + 2 (sparse distillation, weight kd_weight; the
paper's 1.0 / 0.1). The draft chain is unrolled `unroll` steps, each step
reading the previous step's predictions (EAGLE-3's training-time test, Li et
al. 2025), weighted by step_decay**step, so the head learns to draft from its
own features, as it must from the second draft token on.

Medusa (Cai et al. 2024): head j at row t is distilled toward the target's
distribution over token t + 1 + j, weighted 0.8**(j - 1) as in the paper.

Rows whose predicted token lies in the prompt weigh prompt_weight: at
inference a head drafts responses, but prompt text is free extra data.
"""
from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from verispec.proposers.heads.format import HeadConfig
from verispec.proposers.heads.runtime import build_module
from verispec.proposers.heads.target_parts import TargetParts
from verispec.training.features import SequenceData
from verispec.training.losses import feature_regression, sample_negatives, sparse_distillation

CHECKPOINT = "checkpoint.pt"


@dataclass(frozen=True)
class TrainSettings:
    steps: int = 1000
    batch_size: int = 8  # sequences per step
    max_len: int = 512  # a longer sequence keeps its last max_len positions
    lr: float = 5e-4
    warmup: int = 50
    unroll: int = 3  # EAGLE draft steps unrolled in training
    step_decay: float = 0.8
    reg_weight: float = 1.0
    kd_weight: float = 0.1
    topk: int = 16  # target top-k tokens each row is distilled on (<= the data's)
    negatives: int = 512
    prompt_weight: float = 0.25
    seed: int = 0
    checkpoint_every: int = 100
    bf16: bool = True  # bf16 autocast where the CPU has AMX or AVX512-BF16 (faster there)


@dataclass
class History:
    steps: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    regression: list[float] = field(default_factory=list)
    distill: list[float] = field(default_factory=list)
    top1: list[float] = field(default_factory=list)  # draft argmax == target argmax, step-0 rows


@dataclass
class StepStats:
    loss: torch.Tensor
    regression: float
    distill: float
    top1: float


@dataclass
class Batch:
    tokens: torch.Tensor  # [B, T] int64, 0-padded
    lengths: torch.Tensor  # [B]
    num_prompt: torch.Tensor  # [B], prompt positions left in the window
    hidden: dict[int, torch.Tensor]  # layer -> [B, T, h] float32
    topk_ids: torch.Tensor  # [B, T, K]
    topk_probs: torch.Tensor  # [B, T, K]


def make_batch(sequences: Sequence[SequenceData], layers: Sequence[int], topk: int,
               max_len: int) -> Batch:
    lengths = [min(len(s.tokens), max_len) for s in sequences]
    width = max(lengths)
    b = len(sequences)

    def pad(rows: list[torch.Tensor], fill=0) -> torch.Tensor:
        out = torch.full((b, width, *rows[0].shape[1:]), fill, dtype=rows[0].dtype)
        for i, r in enumerate(rows):
            out[i, : r.shape[0]] = r
        return out

    cut = [len(s.tokens) - n for s, n in zip(sequences, lengths)]
    return Batch(
        tokens=pad([s.tokens[c:] for s, c in zip(sequences, cut)]),
        lengths=torch.tensor(lengths),
        num_prompt=torch.tensor([max(0, s.num_prompt - c) for s, c in zip(sequences, cut)]),
        hidden={layer: pad([s.hidden[layer][c:].float() for s, c in zip(sequences, cut)])
                for layer in layers},
        topk_ids=pad([s.topk_ids[c:, :topk] for s, c in zip(sequences, cut)]),
        topk_probs=pad([s.topk_probs[c:, :topk] for s, c in zip(sequences, cut)]))


class HeadTrainer:
    def __init__(self, config: HeadConfig, parts: TargetParts, sequences: Sequence[SequenceData],
                 settings: TrainSettings, draft_vocab: torch.Tensor | None) -> None:
        self.config = config
        self.settings = settings
        self.sequences = sequences
        torch.manual_seed(settings.seed)
        self.module = build_module(config).float().train()
        self.embed = parts.embed.detach().float()
        self.norm_weight = parts.norm_weight.detach().float()
        self.rms_eps = parts.rms_eps
        ids = torch.arange(config.vocab_size) if draft_vocab is None else draft_vocab
        self.draft_ids = ids.long()
        self.in_draft = torch.zeros(config.vocab_size, dtype=torch.bool)
        self.in_draft[self.draft_ids] = True
        from verispec.models.loading import cpu_has_bf16

        # Mixed precision: weights, optimizer and losses stay float32, matmuls run
        # in bf16; the frozen LM-head rows are gathered in bf16 too, halving the
        # memory traffic of the sparse logits.
        self.autocast = settings.bf16 and cpu_has_bf16()
        lm_dtype = torch.bfloat16 if self.autocast else torch.float32
        self.lm_weight = parts.lm_rows(torch.arange(config.vocab_size)).detach().to(lm_dtype)
        self.optimizer = torch.optim.AdamW(self.module.parameters(), lr=settings.lr,
                                           betas=(0.9, 0.95), weight_decay=0.0)
        self.generator = torch.Generator().manual_seed(settings.seed)
        self.step = 0
        self.history = History()
        self.last_layer = config.num_target_layers
        self.layers = sorted(set(config.feature_layers) | {self.last_layer})

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), eps=self.rms_eps) * self.norm_weight

    def lr_at(self, step: int) -> float:
        s = self.settings
        if step < s.warmup:
            return s.lr * (step + 1) / s.warmup
        progress = (step - s.warmup) / max(1, s.steps - s.warmup)
        return s.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))

    def next_batch(self) -> Batch:
        picks = torch.randint(0, len(self.sequences), (self.settings.batch_size,),
                              generator=self.generator).tolist()
        return make_batch([self.sequences[i] for i in picks], self.layers, self.settings.topk,
                          self.settings.max_len)

    def _rows(self, batch: Batch, offset: int, first: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Row mask and weights for predictions at row t of the target's
        distribution at t + offset (predicting token t + offset + 1), t >= first."""
        b, width = batch.tokens.shape
        t = torch.arange(width)[None].expand(b, width)
        valid = (t >= first) & (t + offset < batch.lengths[:, None])
        response = (t + offset + 1) >= batch.num_prompt[:, None]
        weight = torch.where(response, 1.0, self.settings.prompt_weight) * valid
        return valid, weight

    def _distill(self, pred: torch.Tensor, batch: Batch, offset: int, valid: torch.Tensor,
                 negatives: torch.Tensor):
        ids = batch.topk_ids[:, offset:][valid[:, : batch.topk_ids.shape[1] - offset]]
        probs = batch.topk_probs[:, offset:][valid[:, : batch.topk_ids.shape[1] - offset]]
        return sparse_distillation(pred, self.lm_weight, ids, probs, self.in_draft[ids],
                                   negatives, int(self.draft_ids.numel()))

    def losses(self, batch: Batch) -> StepStats:
        s = self.settings
        negatives = sample_negatives(self.draft_ids, s.negatives, self.generator)
        total = torch.zeros(())
        reg_sum = kd_sum = 0.0
        top1 = 0.0
        if self.config.type == "eagle":
            next_tokens = torch.nn.functional.pad(batch.tokens[:, 1:], (0, 1))
            embeds = self.embed[next_tokens]
            feature = self.module.target_feature(
                [batch.hidden[layer] for layer in self.config.feature_layers])
            predictions = self.module.unrolled(feature, embeds, s.unroll, self.final_norm)
            last = batch.hidden[self.last_layer]
            for step, pred in enumerate(predictions):
                valid, weight = self._rows(batch, 1, step)
                valid, weight = valid[:, :-1], weight[:, :-1]
                rows = pred[:, :-1][valid]
                w = weight[valid]
                reg = feature_regression(rows, last[:, 1:][valid])
                kd = self._distill(rows, batch, 1, valid, negatives)
                norm = w.sum().clamp_min(1e-6)
                reg_mean, kd_mean = (reg * w).sum() / norm, (kd.value * w).sum() / norm
                decay = s.step_decay ** step
                total = total + decay * (s.reg_weight * reg_mean + s.kd_weight * kd_mean)
                reg_sum += reg_mean.item() * decay
                kd_sum += kd_mean.item() * decay
                if step == 0:
                    top1 = float(kd.top1.float().mean()) if kd.top1.numel() else 0.0
        else:
            outputs = self.module(batch.hidden[self.last_layer])  # [heads, B, T, h]
            for j in range(1, outputs.shape[0] + 1):
                valid, weight = self._rows(batch, j, 0)
                kd = self._distill(outputs[j - 1][valid], batch, j, valid, negatives)
                w = weight[valid]
                kd_mean = (kd.value * w).sum() / w.sum().clamp_min(1e-6)
                total = total + 0.8 ** (j - 1) * kd_mean
                kd_sum += kd_mean.item() * 0.8 ** (j - 1)
                if j == 1:
                    top1 = float(kd.top1.float().mean()) if kd.top1.numel() else 0.0
        return StepStats(total, reg_sum, kd_sum, top1)

    def train_step(self) -> StepStats:
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr_at(self.step)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
            stats = self.losses(self.next_batch())
        self.optimizer.zero_grad(set_to_none=True)
        stats.loss.backward()
        torch.nn.utils.clip_grad_norm_(self.module.parameters(), 0.5)
        self.optimizer.step()
        self.step += 1
        h = self.history
        h.steps.append(self.step)
        h.loss.append(stats.loss.item())
        h.regression.append(stats.regression)
        h.distill.append(stats.distill)
        h.top1.append(stats.top1)
        return stats

    # -- checkpoints ------------------------------------------------------------
    def save_checkpoint(self, folder: Path) -> Path:
        path = folder / CHECKPOINT
        tmp = path.with_suffix(".tmp")
        torch.save({"step": self.step, "module": self.module.state_dict(),
                    "optimizer": self.optimizer.state_dict(),
                    "generator": self.generator.get_state(), "history": asdict(self.history),
                    "python_random": random.getstate(), "settings": asdict(self.settings),
                    "config": asdict(self.config)}, tmp)
        tmp.replace(path)
        return path

    def load_checkpoint(self, folder: Path) -> None:
        state = torch.load(folder / CHECKPOINT, weights_only=False)
        # The step count may grow on resume (train longer); anything else changes the run.
        ignored = ("steps", "checkpoint_every")
        mine = {k: v for k, v in asdict(self.settings).items() if k not in ignored}
        theirs = {k: v for k, v in state["settings"].items() if k not in ignored}
        if mine != theirs or state["config"]["type"] != self.config.type:
            raise ValueError(f"{folder / CHECKPOINT} was made with other settings; resume with "
                             "the same flags or start in a new --out dir")
        self.module.load_state_dict(state["module"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        random.setstate(state["python_random"])
        self.history = History(**state["history"])
        self.step = state["step"]
