"""The start-up self-check of the static path: does this GPU keep a row's bits
whatever block it is computed in?

Speculation is lossless only if the target's logits for a position are the same
bits decoded alone and inside a verify block. Whether cuBLAS, the attention ops
and the norms keep that on a given GPU, driver and library is measured, not
assumed: after a short context, positions are decoded one by one, then the same
positions are verified as one chain, and as a tree with two branches (each row
must see exactly its ancestors); logits and the keys and values written must
match bit for bit. A failure refuses speculation (`Engine.new_request`) with the
first differing position; plain decoding still runs.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch



@dataclass(frozen=True)
class RowCheck:
    ok: bool
    detail: str  # what was compared, or where the first difference is

    def refusal(self) -> str:
        return ("speculation refused: this GPU breaks the row-invariance contract "
                f"({self.detail}), so speculative output would not equal plain decoding "
                "bit for bit; run with --proposer none, or report the GPU, driver and "
                "torch version with scripts/gpu_check.sh's report")


def _ids(model, count: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, model.vocab_size, (count,), generator=generator)


@torch.inference_mode()
def check_rows(model, block: int | None = None) -> RowCheck:
    """Decode vs a `block`-row chain (default: the model's step width, at most 9)
    and vs a two-branch tree, on `model`'s own forward."""
    block = block or min(getattr(model, "width", 9), 9)
    # Far enough in that some keys are read in place and some in the rows' tails, and
    # across a multiple of the width, where a row's split between them moves.
    context = 4 * getattr(model, "width", 8) - block // 2
    ids = _ids(model, context + max(block, 2))
    fed = ids[context:]
    cache = model.new_cache()
    model.forward(ids[:context], cache, num_logits=0)
    decoded = torch.stack([model.forward(fed[i:i + 1], cache).logits[0]
                           for i in range(max(block, 2))])
    kv_decoded = cache.kv[:, :, :, context:context + block].clone()
    cache.truncate(context)
    chain = model.forward(fed[:block], cache).logits
    bad = _first_difference(decoded[:block], chain)
    if bad is not None:
        return RowCheck(False, f"row {bad} of a {block}-row verify block differs from the "
                               "same position decoded alone")
    if not torch.equal(kv_decoded, cache.kv[:, :, :, context:context + block]):
        return RowCheck(False, f"keys/values written by a {block}-row block differ from decoding")
    cache.truncate(context)
    # A root, a branch of the chain's first token, and a sibling of it: the sibling's
    # row must equal decoding [root, sibling], which the branch must not leak into.
    sibling = (int(fed[1]) + 1) % model.vocab_size
    tree = torch.tensor([int(fed[0]), int(fed[1]), sibling])
    mask = torch.ones(3, context + 3, dtype=torch.bool)
    mask[0, context + 1:] = False
    mask[1, context + 2] = False
    mask[2, context + 1] = False
    positions = torch.tensor([context, context + 1, context + 1])
    tree_logits = model.forward(tree, cache, positions=positions, mask=mask).logits
    cache.truncate(context)
    model.forward(tree[:1], cache)
    alone = model.forward(tree[2:], cache).logits[0]
    if not torch.equal(tree_logits[1], decoded[1]) or not torch.equal(tree_logits[2], alone):
        return RowCheck(False, "a tree row differs from its path decoded alone")
    return RowCheck(True, f"a {block}-row chain and a two-branch tree equal decoding, "
                          "logits and keys/values bit for bit")


def _first_difference(a: torch.Tensor, b: torch.Tensor) -> int | None:
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    rows = (~same.all(-1)).nonzero()
    return int(rows[0]) if rows.numel() else None
