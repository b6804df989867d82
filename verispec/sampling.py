"""Pure logits -> probabilities transforms. The same transform is applied to
the target's and the draft's logits, so rejection sampling compares the
distributions the user actually asked for (vLLM #10198 applied them late)."""
from __future__ import annotations

import random

import torch

from .config import SamplingParams


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
    the processed ones (verispec.processors) wherever a request has processors.

    Greedy (temperature 0) gives a one-hot on the argmax, which makes the
    sampling verifier degenerate exactly into the greedy one.
    """
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(
            logits.argmax(-1), logits.shape[-1]).to(torch.float32)
    logits = logits / params.temperature
    if params.min_p > 0:
        # vLLM v1's order: min_p on the tempered distribution, before top-k / top-p.
        probs = logits.softmax(-1)
        floor = params.min_p * probs.amax(-1, keepdim=True)
        logits = logits.masked_fill(probs < floor, float("-inf"))
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        # Drop a token when the mass strictly before it already reaches top_p;
        # the most likely token is always kept.
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        drop_sorted = mass_before >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def sample(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Draw one token per row of [..., vocab] probabilities; returns [...] int64."""
    flat = probs.reshape(-1, probs.shape[-1])
    drawn = torch.multinomial(flat, 1, generator=generator).squeeze(-1)
    return drawn.reshape(probs.shape[:-1])
