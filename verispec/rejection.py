"""The only home of the accept / resample / bonus math.

Glossary (after vLLM's rejection sampler):
- accepted token: a draft token the verifier keeps;
- recovered token: drawn from the residual max(0, target - draft) at the first
  rejected position (greedy: the target's argmax there);
- bonus token: drawn from the target at position k+1 when all k drafts are
  accepted, for free from the same forward.

Each step emits accepted + 1 tokens. Leviathan et al. 2023 (Thm. 1) and Chen
et al. 2023 prove the emitted tokens are distributed exactly as the target's.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling import sample


@dataclass(frozen=True)
class Verdict:
    num_accepted: int  # draft tokens kept, 0..k
    tokens: list[int]  # the accepted drafts, then one recovered or bonus token
    bonus: bool  # True when every draft was accepted and tokens[-1] is a bonus token


def verify_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> Verdict:
    """Accept the longest prefix equal to the target's argmax, then emit the
    target's own token. draft_tokens: [k]; target_logits: [k + 1, vocab]."""
    k = draft_tokens.shape[0]
    target_tokens = target_logits.argmax(-1)  # [k + 1]
    matches = (target_tokens[:k] == draft_tokens.to(target_tokens.device)).int()
    num_accepted = int(matches.cumprod(0).sum()) if k else 0
    tokens = target_tokens[: num_accepted + 1].tolist()
    return Verdict(num_accepted, tokens, bonus=num_accepted == k)


def verify_sampling(
    draft_tokens: torch.Tensor,  # [k]
    draft_probs: torch.Tensor | None,  # [k, vocab]; None = one-hot (deterministic proposer)
    target_probs: torch.Tensor,  # [k + 1, vocab], already temperature/top-k/top-p transformed
    generator: torch.Generator,
) -> Verdict:
    k = draft_tokens.shape[0]
    device = target_probs.device
    draft_tokens = draft_tokens.to(device)
    rows = torch.arange(k, device=device)
    target_at_draft = target_probs[rows, draft_tokens]  # [k]
    if draft_probs is None:
        draft_at_draft = torch.ones(k, device=device)
    else:
        draft_probs = draft_probs.to(device)
        draft_at_draft = draft_probs[rows, draft_tokens]  # [k]
    # Accept with probability min(1, target/draft); u < ratio does both at once.
    uniforms = torch.rand(k, generator=generator, device=device)
    accepted = uniforms * draft_at_draft < target_at_draft  # [k]
    num_accepted = int(accepted.int().cumprod(0).sum()) if k else 0
    tokens = draft_tokens[:num_accepted].tolist()
    if num_accepted == k:
        tokens.append(int(sample(target_probs[k], generator)))
        return Verdict(num_accepted, tokens, bonus=True)
    i = num_accepted
    if draft_probs is None:
        residual = target_probs[i].clone()
        residual[draft_tokens[i]] = 0.0
    else:
        residual = (target_probs[i] - draft_probs[i]).clamp_min(0.0)
    total = residual.sum()
    # A rejection with zero residual mass only happens through float rounding
    # when target ~= draft; the target itself is then the exact distribution.
    residual = residual / total if total > 0 else target_probs[i]
    tokens.append(int(sample(residual, generator)))
    return Verdict(num_accepted, tokens, bonus=False)
