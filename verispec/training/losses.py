"""Losses of head training, all per row so callers can weight and mask rows.

Sparse distillation. The draft distribution is the target's LM head applied
to the head's output, over a 49k vocabulary for the default model: scoring
every token for every training row would dominate the step. The target's
mass sits on a few tokens, so each row is scored on
- its own top-k tokens under the target (the distillation targets), and
- M negatives shared by the batch, drawn uniformly from the draft vocabulary,
  whose logits get + log((V - k) / M) so that their softmax mass estimates
  that of the whole remaining vocabulary (sampled softmax, Jean et al. 2015).
The loss is the cross-entropy from the target's top-k distribution
(renormalized) to that estimate of the draft's full softmax.

Regression: smooth L1 to the target's next feature, EAGLE's feature loss
(Li et al. 2024, Sec. 4.2), which keeps predicted features in the space the
next draft step reads them in.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class RowLoss:
    value: torch.Tensor  # [rows]
    top1: torch.Tensor  # [rows] bool: the draft's best candidate is the target's argmax


def sample_negatives(draft_ids: torch.Tensor, count: int, generator: torch.Generator) -> torch.Tensor:
    """`count` token ids drawn uniformly, with replacement, from the draft vocabulary."""
    picks = torch.randint(0, draft_ids.numel(), (count,), generator=generator)
    return draft_ids[picks]


def sparse_distillation(pred: torch.Tensor, lm_weight: torch.Tensor, topk_ids: torch.Tensor,
                        topk_probs: torch.Tensor, allowed: torch.Tensor,
                        negatives: torch.Tensor, draft_vocab_size: int) -> RowLoss:
    """pred [R, h]; lm_weight [V, h] frozen; topk_ids, topk_probs, allowed [R, K]
    (allowed: the token is in the draft vocabulary); negatives [M]."""
    k = topk_ids.shape[1]
    m = negatives.numel()
    rows = pred.to(lm_weight.dtype)
    top_logits = torch.einsum("rh,rkh->rk", rows, lm_weight[topk_ids]).float()
    neg_logits = (rows @ lm_weight[negatives].T).float() + math.log(max(draft_vocab_size - k, 1) / m)
    # A negative equal to one of the row's own targets would count that token twice.
    clash = (negatives[None, None, :] == topk_ids[:, :, None]).any(1)  # [R, M]
    neg_logits = neg_logits.masked_fill(clash, float("-inf"))
    top_logits = top_logits.masked_fill(~allowed, float("-inf"))
    log_q = F.log_softmax(torch.cat((top_logits, neg_logits), dim=-1), dim=-1)[:, :k]
    target = topk_probs * allowed
    target = target / target.sum(-1, keepdim=True).clamp_min(1e-9)
    value = -(target * log_q.masked_fill(~allowed, 0.0)).sum(-1)
    best = torch.cat((top_logits, neg_logits), dim=-1).argmax(-1)
    return RowLoss(value, (best == 0) & allowed[:, 0])


def feature_regression(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """[R, h] x [R, h] -> [R] smooth L1, averaged over the hidden size."""
    return F.smooth_l1_loss(pred, target.to(pred.dtype), reduction="none").mean(-1)
