"""Pure logits -> probabilities transforms. The same transform is applied to
the target's and the draft's logits, so rejection sampling compares the
distributions the user actually asked for (vLLM #10198 applied them late)."""
from __future__ import annotations

import random

import torch

from verispec import kernels
from verispec.config import SamplingParams


def greedy_tokens(logits: torch.Tensor) -> int | list[int]:
    """Argmax of each row as Python ints, first index on ties: [vocab] -> int,
    [rows, vocab] -> list of rows ints.

    On CPU numpy's vectorized argmax is an order of magnitude faster than torch's
    on a vocabulary-wide row (docs/notebook/rounds.md, round 5), and this runs on
    every verified row of every request each step. Both return the first maximal
    index, so every greedy path that goes through here picks the same token as
    `torch.argmax`."""
    if logits.device.type != "cpu":
        return logits.argmax(-1).tolist()
    rows = logits.detach()
    if rows.dtype != torch.float32:
        rows = rows.float()  # exact for bf16/fp16: the order of the values is kept
    return rows.numpy().argmax(-1).tolist()


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """One generator per request; a None seed draws a fresh one so runs differ."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed if seed is not None else random.SystemRandom().randrange(2**63))
    return gen


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[..., vocab] logits -> [..., vocab] float32 probabilities. The logits are
    the processed ones (verispec.step.processors) wherever a request has processors.

    Greedy (temperature 0) gives a one-hot on the argmax, which makes the
    sampling verifier degenerate exactly into the greedy one. On CPU with the
    native kernels the rules of `torch_probs` run in one call (kernels/sampling.cpp):
    its nucleus sums run in float64, where torch's in float32 drop a sliver of a
    nucleus of thousands, and its probabilities are torch's to float32 rounding
    (tests/step/test_sampling_kernel.py).
    """
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(
            logits.argmax(-1), logits.shape[-1]).to(torch.float32)
    if logits.device.type == "cpu" and not logits.requires_grad and kernels.available():
        rows = logits.reshape(-1, logits.shape[-1])
        probs = kernels.sampling_probs(rows, params.temperature, params.min_p, params.top_k, params.top_p)
        if probs is not None:
            return probs.reshape(logits.shape)
    return torch_probs(logits, params)


def torch_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """`logits_to_probs` for temperature > 0 in torch calls: the path on a GPU, without
    the native kernels, for logits that need a gradient, and where a row holds a NaN or
    no finite logit."""
    logits = logits.float() / params.temperature
    if params.min_p > 0:
        # vLLM v1's order: min_p on the tempered distribution, before top-k / top-p.
        probs = logits.softmax(-1)
        floor = params.min_p * probs.amax(-1, keepdim=True)
        logits = logits.masked_fill(probs < floor, float("-inf"))
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        logits = logits.masked_fill(~top_p_keep(logits, params.top_p), float("-inf"))
    return logits.softmax(-1)


# The first candidate count tried for the nucleus, then its growth factor. A sort
# of the whole vocabulary costs far more than the forward's other per-row work,
# and at a useful temperature the nucleus is a few tokens, so a top-m selection
# almost always settles it (docs/notebook/sampling.md).
_NUCLEUS_FIRST = 64
_NUCLEUS_GROWTH = 4


def top_p_keep(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """[..., vocab] bool: the nucleus of each row of tempered logits. A token is
    dropped when the probability mass strictly before it, in descending order,
    already reaches top_p; the most likely token is always kept; the order among
    tied probabilities at the boundary is arbitrary, as with a sort.

    Exact without sorting the vocabulary: the m most likely tokens, in order,
    decide every token of the row once their mass reaches top_p, because every
    token after them has at least that mass before it. m grows, for the rows it
    does not settle yet, until it does (at m = vocab it is the full sort). The
    cumulative sums are a prefix of a full sort's of the same probabilities
    (torch's CPU cumsum runs in order), so the kept set is the full sort's."""
    vocab = logits.shape[-1]
    probs = logits.softmax(-1).reshape(-1, vocab)  # [rows, vocab]
    keep = torch.zeros_like(probs, dtype=torch.bool)
    pending = torch.arange(probs.shape[0], device=probs.device)  # rows not settled yet
    size = min(_NUCLEUS_FIRST, vocab)
    while pending.numel():
        every = pending.numel() == probs.shape[0]  # no row settled yet: no copy needed
        top, order = torch.topk(probs if every else probs[pending], size, dim=-1)  # [n, size]
        mass = top.cumsum(-1)
        inside = (mass - top) < top_p  # [n, size]: kept, in descending order
        settled = mass[:, -1] >= top_p if size < vocab else torch.ones_like(inside[:, 0])
        if every and bool(settled.all()):
            keep.scatter_(-1, order, inside)
            break
        done = pending[settled]
        keep[done] = torch.zeros_like(keep[done]).scatter_(-1, order[settled], inside[settled])
        pending = pending[~settled]
        size = min(size * _NUCLEUS_GROWTH, vocab)
    return keep.reshape(logits.shape)


class ProbRows:
    """The rows of `logits_to_probs(logits, params)` for a verified block, each
    computed when first read (`rows[i]`, [vocab] float32) and kept.

    A verifier reads a chain's rows in order, and a tree's along the accepted path,
    and stops at the first rejection: it reads one row per emitted token, as plain
    decoding does, whatever the number of drafts verified. Each row is computed
    alone, with the arithmetic of a one-row block, so a row equals plain
    decoding's row bit for bit whenever the logits do."""

    def __init__(self, logits: torch.Tensor, params: SamplingParams) -> None:
        self.logits = logits  # [rows, vocab], the processed logits
        self.params = params
        self._rows: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return self.logits.shape[0]

    @property
    def device(self) -> torch.device:
        return self.logits.device

    @property
    def computed(self) -> int:
        """Rows computed so far."""
        return len(self._rows)

    def __getitem__(self, row: int) -> torch.Tensor:
        probs = self._rows.get(row)
        if probs is None:
            probs = self._rows[row] = logits_to_probs(self.logits[row], self.params)
        return probs


def sample(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Draw one token per row of [..., vocab] probabilities (not necessarily
    normalized); returns [...] int64.

    By inversion: the first token whose cumulative mass exceeds a uniform draw
    times the row's total, in float64. That is the categorical distribution up to
    float64 rounding, and costs one pass over the row, where torch.multinomial's
    CPU kernel costs several times a whole decode step's sampling work at a 49k
    vocabulary (docs/notebook/sampling.md). A token of zero mass is never drawn: the
    cumulative sum does not rise across it, and `right=True` skips ties."""
    rows = probs.reshape(-1, probs.shape[-1])  # [rows, vocab]
    uniforms = torch.rand(rows.shape[0], generator=generator, dtype=torch.float64,
                          device=generator.device).to(rows.device, non_blocking=True)  # [rows]
    if rows.device.type == "cpu" and rows.dtype == torch.float32 and kernels.available():
        # The same sums in the same order, zeros skipped: the same token, in one pass.
        return kernels.sampling_draw(rows, uniforms).reshape(probs.shape[:-1])
    return torch_draw(rows, uniforms).reshape(probs.shape[:-1])


def torch_draw(rows: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """`sample`'s inversion in torch calls, for [rows, vocab] probabilities and float64
    uniforms [rows]: the path on a GPU and without the native kernels."""
    flat = rows.to(torch.float64)  # [rows, vocab]
    cumulative = flat.cumsum(-1)  # [rows, vocab]
    total = cumulative[:, -1:]  # [rows, 1]
    drawn = torch.searchsorted(cumulative, uniforms[:, None] * total, right=True).squeeze(-1)  # [rows]
    # u * total rounds up to total only when u is within 2^-53 of 1: the last token
    # of positive mass is then the inverse's answer.
    over = drawn >= flat.shape[-1]
    # On a GPU the fix-up always runs: asking whether it is needed would be a host sync.
    if flat.device.type != "cpu" or bool(over.any()):
        last = flat.shape[-1] - 1 - (flat.flip(-1) > 0).int().argmax(-1)
        drawn = torch.where(over, last, drawn)
    return drawn
