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
from typing import TYPE_CHECKING

import torch

from .sampling import greedy_tokens, sample

if TYPE_CHECKING:
    from .sampling import ProbRows
    from .token_tree import TokenTree


@dataclass(frozen=True)
class Verdict:
    num_accepted: int  # draft tokens kept, 0..k
    tokens: list[int]  # the accepted drafts, then one recovered or bonus token
    bonus: bool  # True when every draft was accepted and tokens[-1] is a bonus token


def verify_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor,
                  device_verdict: list[int] | None = None) -> Verdict:
    """Accept the longest prefix equal to the target's argmax, then emit the
    target's own token. draft_tokens: [k]; target_logits: [k + 1, vocab];
    `device_verdict`: the forward's own verdict on these logits, read
    (ForwardOutput.greedy as a list), which replaces the argmax here."""
    k = draft_tokens.shape[0]
    if device_verdict is not None:
        num_accepted = min(device_verdict[0], k)
        return Verdict(num_accepted, device_verdict[1:num_accepted + 2], bonus=num_accepted == k)
    # One device op, then plain Python on k + 1 ints: this runs for every request
    # at every step, where a chain of small tensor ops costs more than the argmax.
    target_tokens = greedy_tokens(target_logits)  # [k + 1]
    drafts = draft_tokens.tolist()
    num_accepted = next((i for i, (t, d) in enumerate(zip(target_tokens, drafts)) if t != d), k)
    return Verdict(num_accepted, target_tokens[: num_accepted + 1], bonus=num_accepted == k)


def verify_sampling(
    draft_tokens: torch.Tensor,  # [k]
    draft_probs: torch.Tensor | None,  # [k, vocab]; None = one-hot (deterministic proposer)
    target_probs: "torch.Tensor | ProbRows",  # [k + 1, vocab], temperature/top-k/top-p applied
    generator: torch.Generator,
) -> Verdict:
    """On CPU, rows of target_probs are read in order up to the first rejection only,
    so a `sampling.ProbRows` computes no row past it (`_accepted`)."""
    k = draft_tokens.shape[0]
    device = target_probs.device
    drafts = draft_tokens.tolist()
    uniforms = torch.rand(k, generator=generator, device=device)  # [k]
    if draft_probs is not None:
        draft_probs = draft_probs.to(device)
        rows = torch.arange(k, device=device)
        # Accept with probability min(1, target/draft); u * draft < target does both at once.
        uniforms = uniforms * draft_probs[rows, draft_tokens.to(device, non_blocking=True)]
    num_accepted = _accepted(drafts, uniforms, target_probs)
    tokens = drafts[:num_accepted]
    if num_accepted == k:
        tokens.append(int(sample(target_probs[k], generator)))
        return Verdict(num_accepted, tokens, bonus=True)
    i = num_accepted
    if draft_probs is None:
        residual = target_probs[i].clone()
        residual[drafts[i]] = 0.0
    else:
        residual = (target_probs[i] - draft_probs[i]).clamp_min(0.0)
    total = residual.sum()
    # A rejection with zero residual mass only happens through float rounding
    # when target ~= draft; the target itself is then the exact distribution.
    # (A `where`, not an `if`: on a GPU the test would be a host sync.)
    residual = torch.where(total > 0, residual / total, target_probs[i])
    tokens.append(int(sample(residual, generator)))
    return Verdict(num_accepted, tokens, bonus=False)


def _accepted(drafts: list[int], thresholds: torch.Tensor,
              target_probs: "torch.Tensor | ProbRows") -> int:
    """The length of the prefix of drafts whose target probability exceeds its threshold.
    On CPU the rows are read in order up to the first rejection; on a GPU every row's
    value comes back in one copy instead of one sync per draft."""
    if thresholds.device.type == "cpu":
        return next((i for i, (x, u) in enumerate(zip(drafts, thresholds.tolist()))
                     if not u < float(target_probs[i][x])), len(drafts))
    if not drafts:
        return 0
    at_drafts = torch.stack([target_probs[i][x] for i, x in enumerate(drafts)])
    passed = (thresholds < at_drafts).long().cumprod(0)
    return int(passed.sum())


def verify_typical(
    draft_tokens: torch.Tensor,  # [k]
    target_probs: torch.Tensor,  # [k + 1, vocab], already temperature/top-k/top-p transformed
    generator: torch.Generator,
    posterior_threshold: float = 0.09,
    posterior_alpha: float = 0.3,
) -> Verdict:
    """Medusa's typical acceptance (Cai et al. 2024, Sec. 2.3.1). LOSSY: the
    output no longer follows the target's distribution, which is why it only
    runs behind SpecConfig.lossy_typical and the stats say so.

    Draft i is accepted when the target gives it probability above
    min(posterior_threshold, posterior_alpha * exp(-H)), H the entropy of the
    target at that position: a plausible token passes even when the draft's
    own distribution is unknown, and a flat target accepts more. The longest
    accepted prefix is kept, then one token is sampled from the target at the
    first position not accepted (a bonus token when every draft passed).
    Defaults are the paper code's epsilon = 0.09, delta = sqrt(epsilon).
    """
    k = draft_tokens.shape[0]
    device = target_probs.device
    draft_tokens = draft_tokens.to(device)
    probs = target_probs[:k].float()  # [k, vocab]
    entropy = -torch.special.xlogy(probs, probs).sum(-1)  # [k]; 0 * log 0 = 0
    threshold = torch.minimum(torch.full_like(entropy, posterior_threshold),
                              posterior_alpha * torch.exp(-entropy))
    accepted = probs[torch.arange(k, device=device), draft_tokens] > threshold  # [k]
    num_accepted = int(accepted.int().cumprod(0).sum()) if k else 0
    tokens = draft_tokens[:num_accepted].tolist()
    tokens.append(int(sample(target_probs[num_accepted], generator)))
    return Verdict(num_accepted, tokens, bonus=num_accepted == k)


# ---------------------------------------------------------------------------
# Token trees: one target forward scores every node, and the verifier walks
# down from the root. The chain functions above are the special case of a tree
# whose every node has one child.


@dataclass(frozen=True)
class TreeVerdict:
    path: list[int]  # accepted node indices, root's child first; each is the parent of the next
    tokens: list[int]  # the accepted nodes' tokens, then one recovered or bonus token
    num_accepted: int  # len(path)
    bonus: bool  # True when the last accepted node (or the root) is a leaf


def verify_tree_greedy(tree: "TokenTree", target_logits: torch.Tensor) -> TreeVerdict:
    """Follow the target's argmax down the tree. target_logits: [N + 1, vocab],
    row 0 for the root (the last committed token), row i + 1 for node i."""
    argmax = greedy_tokens(target_logits)  # [N + 1]
    tokens = tree.token_list
    node, path = -1, []
    while True:
        want = argmax[node + 1]
        # Duplicate siblings carry identical subtrees' prefixes; the first one wins.
        nxt = next((c for c in tree.children(node) if tokens[c] == want), None)
        if nxt is None:
            break
        path.append(nxt)
        node = nxt
    emitted = [tokens[i] for i in path] + [argmax[node + 1]]
    return TreeVerdict(path, emitted, len(path), bonus=not tree.children(node))


def verify_tree_sampling(
    tree: "TokenTree",
    target_probs: "torch.Tensor | ProbRows",  # [N + 1, vocab], temperature/top-k/top-p applied
    generator: torch.Generator,
) -> TreeVerdict:
    """Multi-draft recursive rejection sampling over a token tree: SpecInfer's
    multi-step speculative sampling (Miao et al. 2023, Alg. 2 and Thm. 4.2), the
    scheme EAGLE (Li et al. 2024) uses for its sampled trees.

    At a node whose children c1..cm were drafted from distributions q_c1..q_cm
    (a child's own row of tree.draft_probs; one-hot on its token when
    draft_probs is None), with the residual r starting as the target p at the
    node, child c is accepted with probability min(1, r[x_c] / q_c[x_c]), and
    on rejection r <- normalize(max(0, r - q_c)). Accepting moves the walk to
    c, where r restarts as the target at c; a rejection of every child ends
    the walk with one token drawn from the final r; reaching a leaf ends it
    with a bonus token drawn from the target there.

    Lossless when, given their parent, the children's tokens are independent
    draws from their q (siblings i.i.d. with replacement, duplicates kept: each
    round is then an ordinary speculative-sampling step against the residual
    left by the rounds before, and the last residual is exactly what the
    rounds missed), or deterministic candidates (q one-hot, where the update
    zeroes the rejected token: EAGLE's code). Siblings sampled WITHOUT
    replacement, or i.i.d. siblings with duplicates merged, need another rule
    (Jeon et al. 2024, recursive speculative decoding) and are not lossless here.

    Only the rows of the root and the accepted nodes are read, so a
    `sampling.ProbRows` computes nothing for the branches the walk never enters.
    """
    device = target_probs.device
    n = len(tree)
    tokens = tree.token_list
    draft_probs = tree.draft_probs
    if draft_probs is None:
        draft_at_token = [1.0] * n
    else:
        draft_probs = draft_probs.to(device)
        rows = torch.arange(n, device=device)
        draft_at_token = draft_probs[rows, tree.tokens.to(device)].tolist()  # [N]
    # Each node is tried at most once per walk, so one uniform per node suffices.
    uniforms = torch.rand(n, generator=generator, device=generator.device).tolist()  # [N]
    node, path = -1, []
    while True:
        children = tree.children(node)
        residual = target_probs[node + 1]  # [vocab]
        if not children:
            path_tokens = [tokens[i] for i in path]
            return TreeVerdict(path, path_tokens + [int(sample(residual, generator))],
                               len(path), bonus=True)
        accepted = None
        for child in children:
            x = tokens[child]
            # u < r/q accepts with probability min(1, r/q) without a division.
            if uniforms[child] * draft_at_token[child] < float(residual[x]):
                accepted = child
                break
            draft = draft_probs[child] if draft_probs is not None else None
            residual = _residual(residual, draft, x)
        if accepted is None:
            path_tokens = [tokens[i] for i in path]
            return TreeVerdict(path, path_tokens + [int(sample(residual, generator))],
                               len(path), bonus=False)
        path.append(accepted)
        node = accepted


def _residual(probs: torch.Tensor, draft: torch.Tensor | None, token: int) -> torch.Tensor:
    """normalize(max(0, probs - draft)), the distribution of what a rejected
    round leaves; draft None is a one-hot on `token`, which this zeroes."""
    if draft is None:
        left = probs.clone()
        left[token] = 0.0
    else:
        left = (probs - draft).clamp_min(0.0)
    total = left.sum()
    # Zero mass only arises through float rounding when probs ~= draft; a
    # rejection then had probability ~0 and `probs` is the nearest exact answer.
    return left / total if total > 0 else probs
