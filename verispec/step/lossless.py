"""Checking the law: greedy speculative output equals plain greedy output.

The one tolerated difference is a divergence at a near-tie, where the plain
run's top-2 logits are closer than the dtype can resolve (fp32: under 1e-3,
bf16: under 0.1). The HF backend computes a half-precision model's logits in
fp32 (`models.hf._fp32_head`), so a gap is never a bf16 rounding step wider than
the bound. `compare_greedy` proves which case a
difference is by recomputing the plain run's logits at the first divergence.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from verispec.models.base import TargetModel

NEAR_TIE = {torch.float32: 1e-3, torch.bfloat16: 0.1, torch.float16: 1e-2}


@dataclass(frozen=True)
class Comparison:
    identical: bool
    diverged_at: int | None = None  # index into the generated tokens
    plain_token: int | None = None
    spec_token: int | None = None
    top2_gap: float | None = None  # plain logits: top-1 minus top-2 at the divergence
    near_tie: bool = False  # a tolerated divergence (see module docstring)

    @property
    def ok(self) -> bool:
        return self.identical or self.near_tie

    def describe(self) -> str:
        if self.identical:
            return "identical"
        kind = "near-tie" if self.near_tie else "MISMATCH"
        return (f"{kind} at token {self.diverged_at}: plain {self.plain_token} vs spec "
                f"{self.spec_token}, top-2 gap {self.top2_gap:.3g}")


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _plain_logits_at(target: TargetModel, prompt: list[int], plain: list[int],
                     i: int) -> torch.Tensor:
    """The logits plain decoding saw before emitting plain[i], recomputed along
    the engine's own plain path (prefill all but the last prompt token, then one
    token per forward), so the gap is the one that run really had: a one-shot
    prefill of the whole prefix runs other kernels and rounds differently."""
    cache = target.new_cache(capacity=len(prompt) + i + 1)
    if len(prompt) > 1:
        target.forward(torch.tensor(prompt[:-1]), cache, num_logits=1)
    feed = [prompt[-1]] + plain[:i]
    logits = None
    for token in feed:
        logits = target.forward(torch.tensor([token]), cache, num_logits=1).logits[-1]
    return logits


@torch.inference_mode()
def compare_greedy(target: TargetModel, prompt: list[int], plain: list[int],
                   spec: list[int]) -> Comparison:
    """Compare two greedy outputs of `target` for `prompt` (spec may be cut
    short by a stop, so only the common length is compared)."""
    n = min(len(plain), len(spec))
    i = first_divergence(plain[:n], spec[:n])
    if i is None:
        return Comparison(identical=True)
    logits = _plain_logits_at(target, prompt, plain, i)
    top2 = torch.topk(logits.float(), 2)
    gap = float(top2.values[0] - top2.values[1])
    spec_logit = float(logits[spec[i]])
    # Tolerated only if the speculative pick is itself within the tie margin
    # of the plain top-1: a tie between other tokens excuses nothing.
    margin = NEAR_TIE.get(target.dtype, 1e-3) * (1 - 1e-9)  # strictly under the bound
    near = gap <= margin and float(top2.values[0]) - spec_logit <= margin
    return Comparison(False, i, plain[i], spec[i], gap, near)
