"""The mechanism of lossless speculation, on token ids only: one sequence's state,
what one target forward feeds (`feed`), and what its output commits (`commit`:
verify, roll back or compact the cache, stop checks). How much to draft is not
decided here (verispec.plan), nor what to draft (verispec.drafting), nor is anything
timed: the step that joins them, and its clock, is `verispec.request`.

Cache invariant: between steps the target cache holds every committed token
but the last one, which is fed first in the next step together with the
drafts. Row i of that forward's logits then predicts the token after draft i,
so one pass verifies all drafts and yields one more token for free.

A chain is the tree whose node i hangs below node i - 1: both go through the one
`commit`, and a chain takes its fast path there (rows in order, the cache cut
at the accepted prefix instead of compacted).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .config import SamplingParams, SpecConfig
from .grammar import Constraint, apply_mask, masked_draft_probs
from .models.base import BatchItem, ForwardOutput, TargetModel
from .processors import LogitProcessor, TokenLogprob, chain_ancestry, token_logprobs
from .proposers.base import Proposal, VerifiedRows
from .rejection import Verdict, verify_greedy, verify_sampling, verify_typical
from .sampling import ProbRows, logits_to_probs
from .stopping import Stopper
from .token_tree import ROOT
from .tree import TreeFeed, tree_ancestry, tree_feed, tree_finish


def validate_prompt(target: TargetModel, prompt: list[int], sampling: SamplingParams) -> None:
    if not prompt:
        raise ValueError("the prompt is empty")
    if min(prompt) < 0 or max(prompt) >= target.vocab_size:
        raise ValueError(f"prompt token ids must be in [0, {target.vocab_size})")
    need = len(prompt) + sampling.max_new_tokens
    if need > target.max_context:
        raise ValueError(
            f"prompt ({len(prompt)} tokens) + max_new_tokens ({sampling.max_new_tokens}) = "
            f"{need} exceeds the model's context of {target.max_context} tokens")


@dataclass(eq=False)
class Sequence:
    """One request's decoding state: positions are the state (gpt-fast), the cache
    holds all of `tokens` but the last between steps."""
    target: TargetModel
    sampling: SamplingParams
    cache: object  # the request's own KV cache; None once released
    tokens: list[int]  # prompt then output
    num_prompt: int
    stopper: Stopper
    generator: torch.Generator
    processor: LogitProcessor
    constraint: Constraint | None = None  # a grammar the output must match (verispec.grammar)
    lossy_typical: bool = False  # SpecConfig.lossy_typical: Medusa's typical acceptance (opt-in)
    hidden_layers: tuple[int, ...] = ()  # target hidden states the proposer reads
    hidden: tuple[torch.Tensor, ...] = ()  # per layer, rows of the positions committed last
    generated: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    prefilled: bool = False

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def room(self, k: int) -> int:
        """The most drafts the next step may verify: k, and never past max_new_tokens
        (the bonus token needs one slot) or the context."""
        return max(0, min(k, self.sampling.max_new_tokens - len(self.generated) - 1,
                          self.target.max_context - len(self.tokens)))


def new_sequence(target: TargetModel, prompt: list[int], sampling: SamplingParams,
                 spec: SpecConfig, stopper: Stopper, generator: torch.Generator,
                 constraint: Constraint | None = None,
                 hidden_layers: tuple[int, ...] = ()) -> Sequence:
    validate_prompt(target, prompt, sampling)
    # Validates logit_bias ids against the vocabulary before any model work.
    processor = LogitProcessor(sampling, target.vocab_size, target.eos_token_ids)
    # A tree step briefly holds all its nodes before compaction.
    cache = target.new_cache(capacity=min(
        target.max_context, len(prompt) + sampling.max_new_tokens + spec.tree))
    return Sequence(target, sampling, cache, list(prompt), len(prompt), stopper, generator,
                    processor, constraint, spec.lossy_typical, tuple(hidden_layers),
                    prefilled=len(prompt) <= 1)  # a one-token prompt has nothing to prefill


def prefill_item(seq: Sequence) -> BatchItem:
    """The prompt but its last token, which the first decode step feeds."""
    return BatchItem(torch.tensor(seq.tokens[:-1]), seq.cache, num_logits=1,
                     hidden_layers=seq.hidden_layers)


def prefilled(seq: Sequence, out: ForwardOutput) -> None:
    seq.hidden = out.hidden
    seq.prefilled = True


@dataclass
class Draft:
    """What one step verifies, as the mechanism needs it: a chain, or a tree's feed."""
    chain: torch.Tensor  # [k] int64 drafts (empty for a tree step)
    draft_probs: torch.Tensor | None = None  # [k, vocab]; None: one-hot
    allowed: torch.Tensor | None = None  # [k + 1, vocab] bool: the grammar's mask per row
    tree: TreeFeed | None = None  # a tree step

    @property
    def nodes(self) -> tuple[list[int], list[int]]:
        """Fed drafts and their parents, node order (a chain's node i hangs below i - 1)."""
        if self.tree is not None:
            return self.tree.tree.token_list, self.tree.tree.parent_list
        chain = self.chain.tolist()
        return chain, list(range(ROOT, len(chain) - 1))


def shape_draft(seq: Sequence, proposal: Proposal, depth: int) -> Draft:
    """A proposal cut to what this step may verify: `depth` drafts deep (max_new_tokens),
    a tree's nodes within the cache and context; a chain's rows masked by the grammar."""
    if proposal.tree is not None:
        room_nodes = min(seq.target.max_context, getattr(seq.cache, "capacity", None)
                         or seq.target.max_context) - len(seq.tokens)
        tree = proposal.tree.trimmed(max_depth=depth, max_nodes=room_nodes)
        return Draft(torch.empty(0, dtype=torch.long), tree=tree_feed(seq.cache.length,
                                                                       seq.tokens, tree))
    chain = proposal.tokens[:depth].to(torch.long)
    probs = proposal.draft_probs[:depth] if proposal.draft_probs is not None else None
    allowed = None
    if seq.constraint is not None:
        allowed = seq.constraint.masks(chain.tolist())  # [k + 1, vocab]
        probs = masked_draft_probs(probs, allowed[: chain.shape[0]])
    return Draft(chain, probs, allowed)


def feed(seq: Sequence, draft: Draft) -> BatchItem:
    """The target forward that verifies `draft`: the last committed token, then the drafts."""
    if draft.tree is not None:
        fed = draft.tree
        return BatchItem(fed.tokens, seq.cache, positions=fed.layout.positions,
                         mask=fed.layout.mask, hidden_layers=seq.hidden_layers)
    tokens = torch.cat([torch.tensor([seq.tokens[-1]]), draft.chain])  # [k + 1]
    return BatchItem(tokens, seq.cache, hidden_layers=seq.hidden_layers)


@dataclass
class Committed:
    """What one verify forward committed (rejection.py's glossary)."""
    tokens: list[int]  # committed, cut at a stop: accepted drafts, then a recovered or bonus token
    num_accepted: int
    drafted: int  # draft tokens (chain) or tree nodes verified
    leaf: bool = False  # tree step: the accepted path ended at a leaf (nothing was rejected)
    bonus: bool = False  # the last verified token is the bonus (every draft on its path accepted)
    rejected: list[int] = field(default_factory=list)  # drafts discarded, the rejected one first
    logprobs: list[TokenLogprob] | None = None  # per committed token, from its processed row
    rows: VerifiedRows | None = None  # the target's argmax at every fed row (when asked)
    finish_reason: str | None = None


def commit(seq: Sequence, draft: Draft, out: ForwardOutput, rows: bool = False) -> Committed:
    """Verify the drafts against the forward's logits, keep the cache's accepted rows,
    append the committed tokens up to the first stop (EOS, a stop string or
    max_new_tokens, even inside an accepted block). `rows`: also report the target's
    argmax at every fed row (`Proposer.reads_rows`) when drafts were fed; a plain step's
    one row is the committed token's, which the context already holds."""
    tokens, parents = draft.nodes
    if draft.tree is not None:
        fed = draft.tree
        ancestry = tree_ancestry(fed) if seq.processor.active else None
        logits = seq.processor.process(out.logits, seq.tokens, seq.num_prompt, fed.tree.tokens,
                                       ancestry)  # [N + 1, vocab]
        result = tree_finish(fed, out, seq.cache, seq.sampling, seq.generator, logits)
        # The rejected candidates: the children of the last accepted node.
        below = fed.tree.children(result.path[-1] if result.path else ROOT)
        emitted_rows = [0] + [i + 1 for i in result.path]  # the rows the tokens came from
        verdict = Verdict(result.num_accepted, result.tokens, result.bonus)
        hidden, rejected = result.hidden, [tokens[i] for i in below]
    else:
        chain = draft.chain
        # Only an active processor reads the ancestry: its tensor calls, cold after a
        # target pass, are host time every step would pay.
        ancestry = chain_ancestry(chain.shape[0]) if seq.processor.active else None
        logits = seq.processor.process(out.logits, seq.tokens, seq.num_prompt, chain,
                                       ancestry)  # [k + 1, vocab]
        if draft.allowed is not None:
            logits = apply_mask(logits, draft.allowed)
        verdict = _verify_chain(chain, draft.draft_probs, logits, seq)
        # Roll back the rejected drafts: keep the fed token and the accepted ones.
        seq.cache.truncate(len(seq.tokens) + verdict.num_accepted)
        hidden = tuple(h[: verdict.num_accepted + 1] for h in out.hidden)
        emitted_rows = list(range(len(verdict.tokens)))
        rejected = tokens[verdict.num_accepted:]
    logprobs = None
    if seq.sampling.logprobs is not None:
        logprobs = token_logprobs(logits[emitted_rows], verdict.tokens, seq.sampling)
    seq.hidden = hidden
    committed: list[int] = []
    for token in verdict.tokens:
        committed.append(token)
        seq.generated.append(token)
        seq.finish_reason = seq.stopper.check(seq.generated)
        if seq.finish_reason:
            break
    seq.tokens.extend(committed)
    if seq.constraint is not None:
        seq.constraint.commit(committed)
    verified = None
    if rows and tokens:
        verified = VerifiedRows(tokens, parents, logits.argmax(dim=-1).tolist(), committed)
    # Cut with the tokens: nothing past EOS, a stop string or max_new_tokens (vLLM #47616).
    return Committed(committed, verdict.num_accepted, len(tokens),
                     leaf=draft.tree is not None and verdict.bonus, bonus=verdict.bonus,
                     rejected=rejected,
                     logprobs=logprobs[: len(committed)] if logprobs is not None else None,
                     rows=verified, finish_reason=seq.finish_reason)


def _verify_chain(drafts: torch.Tensor, draft_probs: torch.Tensor | None,
                  target_logits: torch.Tensor, seq: Sequence) -> Verdict:
    if seq.sampling.greedy:
        return verify_greedy(drafts, target_logits)
    if seq.lossy_typical:  # opt-in (SpecConfig.lossy_typical); the request's stats say lossy
        return verify_typical(drafts, logits_to_probs(target_logits, seq.sampling), seq.generator)
    # Rows computed as the verifier reads them: none past the first rejection.
    return verify_sampling(drafts, draft_probs, ProbRows(target_logits, seq.sampling),
                           seq.generator)
