"""`verispec profile`: what one target forward over n new positions costs.

Speculation pays only if verifying k+1 positions costs little more than
decoding one, i.e. while the forward is memory-bound (every weight is read
once whatever n is). This measures T(n) after a realistic context, the draft's
cost per token, and the bandwidth bound weight bytes / memory bandwidth that
T(1) cannot beat, and writes the curve `economics.load_profile` reads.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from verispec.bench.collector import frozen_heap
from verispec.bench.workloads import load_workload

_FIT_N = 8  # the overhead slope is fitted over n = 1..8, the k+1 range that matters


@dataclass
class Profile:
    n: list[int]
    seconds: list[float]  # median T(n) over the repeats
    samples: list[list[float]]  # every timing, per n
    context: int
    repeats: int
    draft: str | None = None
    draft_seconds: float | None = None  # median 1-token draft forward
    weight_bytes: int | None = None
    bandwidth: float | None = None  # bytes/s, best of a big sum and a big copy
    extra: dict = field(default_factory=dict)

    @property
    def t1(self) -> float:
        return self.seconds[0]

    @property
    def relative(self) -> list[float]:
        return [s / self.t1 for s in self.seconds]

    @property
    def verify_overhead(self) -> float:
        """Slope of T(n)/T(1) over n = 1..8: the `verify_overhead` of the cost model.

        Least squares through (1, 1), because the cost model is 1 + o(n-1) and
        T(1)/T(1) is 1 by definition; a free intercept would hide a step at n = 2.
        """
        m = min(_FIT_N, len(self.n))
        x = np.asarray(self.n[:m], dtype=float) - 1.0
        y = np.asarray(self.relative[:m]) - 1.0
        return float(x @ y / (x @ x))

    @property
    def draft_cost_per_token(self) -> float | None:
        return None if self.draft_seconds is None else self.draft_seconds / self.t1

    @property
    def bandwidth_bound(self) -> float | None:
        if not self.weight_bytes or not self.bandwidth:
            return None
        return self.weight_bytes / self.bandwidth

    def to_json(self) -> dict:
        """The `load_profile` format (economics module docstring) plus context."""
        data: dict = {"n": self.n, "seconds": self.seconds}
        if self.draft_cost_per_token is not None:
            data["draft_cost_per_token"] = self.draft_cost_per_token
        data.update({
            "relative": self.relative, "t1_ms": 1000 * self.t1,
            "verify_overhead": self.verify_overhead, "context": self.context,
            "repeats": self.repeats, "draft": self.draft, "draft_seconds": self.draft_seconds,
            "weight_bytes": self.weight_bytes, "bandwidth_bytes_per_s": self.bandwidth,
            "bandwidth_bound_s": self.bandwidth_bound, "samples": self.samples, **self.extra,
        })
        return data


def text_ids(tokenizer, count: int, vocab_size: int) -> list[int]:
    """`count` token ids of real prose: the summarize workload's documents,
    repeated if short. Random ids would give attention patterns no real
    context has; without a tokenizer they are all that is left."""
    if tokenizer is None:
        generator = torch.Generator().manual_seed(0)
        return torch.randint(0, vocab_size, (count,), generator=generator).tolist()
    ids: list[int] = []
    for prompt in load_workload("summarize"):
        for message in prompt.messages:
            ids += [int(i) for i in tokenizer.encode(message["content"], add_special_tokens=False)]
        if len(ids) >= count:
            break
    if not ids:
        raise ValueError("the tokenizer produced no tokens for the profile text")
    while len(ids) < count:
        ids += ids
    return [i % vocab_size for i in ids[:count]]


def _native_weight_bytes(weights) -> int:
    """A native target's bytes per decode step: every layer's norms and matrices (packed
    as they run: GGUF blocks, int8 tiles or bf16), the final norm and the LM head; the
    input embedding is one row a step (or the LM head itself, when tied)."""
    def linear(lin) -> list[torch.Tensor]:
        parts = getattr(lin, "parts", None) or [lin]
        return [t for part in parts for t in (part.weight, part.bias) if t is not None]

    tensors = [weights.norm, *linear(weights.lm_head)]
    for layer in weights.layers:
        tensors += [layer.attn_norm, layer.mlp_norm, *linear(layer.qkv), *linear(layer.o),
                    *linear(layer.gate_up), *linear(layer.down)]
        if layer.qk_norm is not None:
            tensors.append(layer.qk_norm)
    # Shared tensors count once. oneDNN's packed weights (the dense path without verispec's
    # kernels) have no storage to point at; each is its own.
    seen = {(t.data_ptr() if t.layout == torch.strided else id(t)): t.numel() * t.element_size()
            for t in tensors}
    return sum(seen.values())


def weight_bytes(target) -> int | None:
    """Bytes a decode step must read: every parameter once, except an untied
    input embedding, of which a step reads one row."""
    native = getattr(target, "weights", None)
    if native is not None and hasattr(native, "layers") and hasattr(native, "lm_head"):
        return _native_weight_bytes(native)
    module = target if isinstance(target, torch.nn.Module) else getattr(target, "model", None)
    if not isinstance(module, torch.nn.Module):
        return None
    total = sum(p.numel() * p.element_size() for p in module.parameters())
    get_in = getattr(module, "get_input_embeddings", None)
    get_out = getattr(module, "get_output_embeddings", None)
    if get_in is not None and get_out is not None and get_in() is not None and get_out() is not None:
        emb, head = get_in().weight, get_out().weight
        if emb.data_ptr() != head.data_ptr():
            total -= emb.numel() * emb.element_size()
    return total


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_bandwidth(device: torch.device, megabytes: int | None = None, repeats: int = 5) -> float:
    """Achievable memory bandwidth in bytes/s: the better of a sum (reads each
    byte once) and a copy (reads and writes each byte) over a tensor far
    larger than any cache."""
    megabytes = megabytes or (1024 if device.type == "cuda" else 256)
    x = torch.ones(megabytes * (1 << 20) // 4, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    nbytes = x.numel() * 4
    best = 0.0
    for op, moved in ((lambda: x.sum(), nbytes), (lambda: y.copy_(x), 2 * nbytes)):
        op()
        times = []
        for _ in range(repeats):
            _sync(device)
            start = time.perf_counter()
            op()
            _sync(device)
            times.append(time.perf_counter() - start)
        best = max(best, moved / statistics.median(times))
    return best


def _timed(fn, device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


@torch.inference_mode()
def measure(target, ids: list[int], context: int, max_n: int, repeats: int,
            draft=None, draft_name: str | None = None, warmup: int = 2,
            widths: Sequence[int] | None = None) -> Profile:
    """T(n) for n = 1..max_n (or for the given `widths`, each <= max_n) after
    `context` tokens of `ids`; the cache is cut back to the context after every
    forward, so each n sees the same state."""
    if context < 1 or max_n < 2 or repeats < 1:
        raise ValueError("need context >= 1, max-n >= 2 and repeats >= 1")
    if context + max_n > target.max_context:
        raise ValueError(f"context {context} + max-n {max_n} exceeds the model's "
                         f"{target.max_context} positions")
    device = target.device
    prefix, feed = torch.tensor(ids[:context]), torch.tensor(ids[context:context + max_n])
    cache = target.new_cache()
    target.forward(prefix, cache, num_logits=1)
    draft_cache = None
    if draft is not None:
        draft_cache = draft.new_cache()
        draft.forward(prefix, draft_cache, num_logits=1)

    def target_step(n: int) -> float:
        # All n logit rows, as in verification (the engine keeps every row).
        seconds = _timed(lambda: target.forward(feed[:n], cache), device)
        cache.truncate(context)
        return seconds

    def draft_step() -> float:
        # One row, as the draft proposer asks for while drafting.
        seconds = _timed(lambda: draft.forward(feed[:1], draft_cache, num_logits=1), device)
        draft_cache.truncate(context)
        return seconds

    ns = sorted(widths) if widths else list(range(1, max_n + 1))
    samples: dict[int, list[float]] = {n: [] for n in ns}
    draft_samples: list[float] = []
    with frozen_heap():
        for _ in range(warmup):
            for n in (1, max_n):
                target_step(n)
            if draft is not None:
                draft_step()
        for rep in range(repeats):
            # Alternate the sweep direction so slow drift does not tilt the curve.
            order = ns if rep % 2 == 0 else ns[::-1]
            for n in order:
                samples[n].append(target_step(n))
                if draft is not None:
                    draft_samples.append(draft_step())
    return Profile(
        n=list(samples), seconds=[statistics.median(v) for v in samples.values()],
        samples=list(samples.values()), context=context, repeats=repeats, draft=draft_name,
        draft_seconds=statistics.median(draft_samples) if draft_samples else None,
        weight_bytes=weight_bytes(target))


def plot(path: str | Path, profile: Profile, title: str = "") -> Path:
    from verispec.bench.plots import plt, save_figure

    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    ax.plot(profile.n, profile.relative, marker="o", ms=3, label="measured T(n)/T(1)")
    slope = profile.verify_overhead
    ax.plot(profile.n, [1 + slope * (n - 1) for n in profile.n], ls="--", lw=1,
            label=f"fit through (1, 1), n <= {_FIT_N}: 1 + {slope:.3f}(n-1)")
    ax.axhline(1.0, color="grey", lw=0.8, ls=":", label="free verification")
    ax.set_xlabel("n (positions in one forward)")
    ax.set_ylabel("T(n) / T(1)")
    ax.set_title(title or f"T(1) = {1000 * profile.t1:.2f} ms, context {profile.context}",
                 fontsize=9)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def format_profile(profile: Profile, label: str) -> str:
    lines = [f"{label}: context {profile.context} tokens, median of {profile.repeats} repeats",
             f"T(1) = {1000 * profile.t1:.3f} ms", "", "   n  T(n)/T(1)   T(n) ms"]
    lines += [f"{n:>4}  {r:>9.3f}  {1000 * s:>8.3f}"
              for n, r, s in zip(profile.n, profile.relative, profile.seconds)]
    lines += ["", f"verification overhead per extra position: {profile.verify_overhead:.4f} "
                  f"(slope of T(n)/T(1) over n = 1..{min(_FIT_N, len(profile.n))})"]
    if profile.bandwidth_bound is not None:
        lines.append(
            f"bandwidth bound on T(1): {profile.weight_bytes / 1e6:.1f} MB of weights / "
            f"{profile.bandwidth / 1e9:.1f} GB/s = {1000 * profile.bandwidth_bound:.3f} ms "
            f"(measured T(1) is {profile.t1 / profile.bandwidth_bound:.2f}x that)")
    if profile.draft_seconds is not None:
        lines.append(f"draft {profile.draft}: {1000 * profile.draft_seconds:.3f} ms per token "
                     f"= {profile.draft_cost_per_token:.3f} of T(1) (draft_cost_per_token)")
    return "\n".join(lines)
