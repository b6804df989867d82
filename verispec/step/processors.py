"""The request's logit processors, in one place: logit_bias, presence,
frequency and repetition penalties, min_tokens; and logprobs of what was emitted.

Why this module exists: peers lost these under speculation (vLLM #18902
ignored penalties on verified tokens, SGLang #26330 bypassed a processor).
The rule that keeps them exact: row r of a verified block is processed with
its own prefix, i.e. the committed tokens plus the drafts on r's path (a
chain's drafts before r, a tree node's ancestors and itself). Plain decoding
is the one-row case with no drafts, so both run the same arithmetic on the
same integer counts and agree bit for bit whenever the raw logits do.

Order, after vLLM v1: logit_bias, then repetition, frequency and presence
penalties on the biased logits, then min_tokens masks EOS to -inf last so no
penalty can lift it. Temperature, min_p, top-k and top-p follow in
`sampling.logits_to_probs`. The engine sees token ids only; so does this.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from verispec.config import SamplingParams


def chain_ancestry(k: int) -> torch.Tensor:
    """[k + 1, k] bool: row i (fed token i - 1's successor) has drafts 0..i-1 in its prefix."""
    return torch.ones(k + 1, k, dtype=torch.bool).tril(-1)


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # the N most likely (id, logprob), best first


class LogitProcessor:
    """Built once per request. `active` is False for neutral settings, and then
    `process` returns the logits untouched (no cost on the default path)."""

    def __init__(self, sampling: SamplingParams, vocab_size: int,
                 eos_token_ids: frozenset[int] | Sequence[int]) -> None:
        self.sampling = sampling
        self.vocab_size = vocab_size
        bad = [t for t, _ in sampling.logit_bias if t >= vocab_size]
        if bad:
            raise ValueError(f"logit_bias token ids must be in [0, {vocab_size}), got {bad[0]}")
        self.bias = None
        if sampling.logit_bias:
            self.bias = torch.zeros(vocab_size)  # [vocab]
            for token, value in sampling.logit_bias:
                self.bias[token] = value
        self.repetition = sampling.repetition_penalty
        self.frequency = sampling.frequency_penalty
        self.presence = sampling.presence_penalty
        self.penalized = self.repetition != 1.0 or self.frequency != 0.0 or self.presence != 0.0
        eos = sorted(t for t in eos_token_ids if t < vocab_size)
        self.eos = torch.tensor(eos, dtype=torch.long) if sampling.min_tokens and eos else None
        self.active = self.bias is not None or self.penalized or self.eos is not None

    def process(self, logits: torch.Tensor, committed: Sequence[int], num_prompt: int,
                drafts: torch.Tensor | None = None,
                ancestry: torch.Tensor | None = None) -> torch.Tensor:
        """logits: [R, vocab] float; committed: prompt then generated ids; drafts: [N];
        ancestry: [R, N] bool, True where draft j is in row r's prefix (None: no drafts).
        Returns [R, vocab] processed float32 logits (the input itself when inactive)."""
        if not self.active:
            return logits
        logits = logits.float()
        rows, vocab = logits.shape
        device = logits.device
        out = logits.clone()
        in_prefix = None  # [R, N] float: which drafts each row's prefix holds
        if drafts is not None and drafts.numel():
            in_prefix = ancestry.to(device=device, dtype=torch.float32)
        if self.bias is not None:
            out += self.bias.to(device)  # [R, vocab]
        if self.penalized:
            out = self._penalize(out, committed, num_prompt, drafts, ancestry)
        if self.eos is not None:
            produced = len(committed) - num_prompt + (
                in_prefix.sum(-1) if in_prefix is not None else torch.zeros(rows, device=device))
            held = (produced < self.sampling.min_tokens).nonzero().squeeze(-1)  # rows before min
            if held.numel():
                eos = self.eos.to(device)
                out[held[:, None], eos[None, :]] = float("-inf")
        return out

    def _penalize(self, out: torch.Tensor, committed: Sequence[int], num_prompt: int,
                  drafts: torch.Tensor | None, ancestry: torch.Tensor | None) -> torch.Tensor:
        """The penalties, on the columns of tokens some row has seen only: a few
        hundred of a vocabulary of tens of thousands, so [R, U] work, not [R, vocab].
        Every other column has count 0 and is not seen, which the penalties leave be."""
        rows, vocab = out.shape
        device = out.device
        history = torch.tensor(list(committed), dtype=torch.long, device=device)
        drafted = drafts.to(device) if drafts is not None and drafts.numel() else \
            torch.empty(0, dtype=torch.long, device=device)
        ids, where = torch.unique(torch.cat([history, drafted]), return_inverse=True)  # [U]
        counts = torch.zeros(ids.numel(), device=device)  # [U]: output tokens committed
        counts.index_add_(0, where[num_prompt:history.numel()],
                          torch.ones(history.numel() - num_prompt, device=device))
        counts = counts.expand(rows, -1).clone()  # [R, U]
        if drafted.numel():
            # counts[r, drafts[j]] += 1 for every draft j in row r's prefix.
            row, col = ancestry.to(device).nonzero(as_tuple=True)
            counts.index_put_((row, where[history.numel():][col]),
                              torch.ones(row.numel(), device=device), accumulate=True)
        block = out[:, ids]  # [R, U]
        if self.repetition != 1.0:
            in_prompt = torch.zeros(ids.numel(), dtype=torch.bool, device=device)
            in_prompt[where[:num_prompt]] = True
            seen = (counts > 0) | in_prompt  # [R, U]
            scaled = torch.where(block > 0, block / self.repetition, block * self.repetition)
            block = torch.where(seen, scaled, block)
        if self.frequency != 0.0:
            block = block - self.frequency * counts
        if self.presence != 0.0:
            block = block - self.presence * (counts > 0).float()
        out[:, ids] = block
        return out

    def one(self, logits: torch.Tensor, committed: Sequence[int], num_prompt: int) -> torch.Tensor:
        """[vocab] -> [vocab]: the next token's processed logits after `committed`."""
        return self.process(logits[None], committed, num_prompt)[0]


def logprob_rows(processed: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """[R, vocab] processed logits -> [R, vocab] log-probabilities as logprobs report
    them: after the processors and the temperature (none when greedy), before the
    sampling filters (min_p, top-k, top-p), so every listed alternative is finite
    unless a processor forbade it (min_tokens' EOS, reported as -inf)."""
    scaled = processed.float() if sampling.greedy else processed.float() / sampling.temperature
    return torch.log_softmax(scaled, dim=-1)


def token_logprobs(processed: torch.Tensor, tokens: Sequence[int],
                   sampling: SamplingParams) -> list[TokenLogprob]:
    """processed: [len(tokens), vocab], row i the distribution token i was drawn from."""
    logprobs = logprob_rows(processed, sampling)  # [T, vocab]
    picked = logprobs.gather(-1, torch.tensor(list(tokens), device=logprobs.device)[:, None])
    picked = picked.squeeze(-1).tolist()  # [T]
    top_n = sampling.logprobs or 0
    if top_n:
        values, ids = logprobs.topk(top_n, dim=-1)  # [T, N]; ties to the lower id
        tops = [tuple(zip(i, v)) for i, v in zip(ids.tolist(), values.tolist())]
    else:
        tops = [()] * len(picked)
    return [TokenLogprob(int(t), lp, top) for t, lp, top in zip(tokens, picked, tops)]
