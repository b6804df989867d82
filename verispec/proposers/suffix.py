"""Suffix decoding (Oliaro et al., "SuffixDecoding", NeurIPS 2025; Snowflake's
ArcticInference; vLLM's `suffix` method): draft what followed the context's
suffix, counted over two token stores (verispec.proposers.suffix_store):

- the global store, past outputs of every request of the Engine (or of every
  request a server runs), which learns as requests finish;
- this request's own prompt and output so far.

In each store the occurrences of the context's suffix of length m and what
followed them form a weighted trie: a node's frequency-based probability is
the share of occurrences that pass through it. A draft grows best-first
while that probability stays at least `min_prob`, to a depth of at most
`factor * m + offset` (and k): the longer the match, the further its
continuation is trusted. A chain takes each node's likeliest child; a tree
takes the best nodes up to the step's budget. A draft's score is the sum of
its nodes' probabilities, the number of tokens it expects accepted; each
store is tried at its few longest match lengths and the best-scoring draft of
either store is proposed.

Drafts are a deterministic function of the context and the stores' contents,
never of the request's sampler, so they carry no draft_probs: the one-hot
(chain) and multi-draft (tree) rejection rules keep sampled output exactly the
target's. With SpecConfig.frequency_drafts a sampled request's chain is drawn
instead from the best draft's occurrence counts, with those counts as its
draft_probs (verispec.proposers.ngram_sampled).
"""
from __future__ import annotations

import heapq
import math
from array import array
from dataclasses import dataclass

import torch

from verispec import kernels
from verispec.policy.acceptance import Evidence
from verispec.proposers.base import DraftContext, Proposal, Proposer, ProposerSetup, register
from verispec.proposers.ngram import match_evidence
from verispec.proposers.ngram_sampled import FrequencyDrafts
from verispec.proposers.suffix_store import ANCHORS, SuffixIndex, SuffixStore
from verispec.proposers.tree_drafting import DraftTree, as_proposal

MATCH_LENGTHS_TRIED = 4  # distinct match lengths scored per store, longest first


@dataclass(frozen=True)
class SuffixSettings:
    factor: float = 1.0  # max_spec_factor: draft depth per matched token
    offset: float = 0.0  # added to factor * m
    min_prob: float = 0.1  # min_token_prob: a node's path probability must stay at least this

    def depth_cap(self, match_length: int) -> int:
        return int(math.floor(self.factor * match_length + self.offset))


@dataclass
class ScoredDraft:
    tokens: list[int]  # the draft's tokens, node order
    score: float  # expected accepted tokens: the sum of the nodes' path probabilities
    match_length: int
    source: str  # "global" or "request"
    tree: DraftTree | None = None  # a tree draft (None: a chain)
    paths: list[list[int]] | None = None  # the occurrences' continuations it was grown from


@dataclass(frozen=True)
class ChainCandidate:
    """The likeliest chain through the continuations of the occurrences that match at
    least `match_length` tokens, to its depth cap at the lookup's k. A shorter k's
    chain is its prefix: every depth's choice ignores the cap."""
    match_length: int
    tokens: list[int]
    probs: list[float]  # each token's path probability; a prefix's sum is its score


@dataclass(frozen=True)
class ChainLookup:
    """One store's lookup for chain drafts."""
    longest: int  # the longest match (0: none), the step's evidence
    chains: list[ChainCandidate]  # at the MATCH_LENGTHS_TRIED longest match lengths


def likeliest_chain(paths: list[list[int]], depth: int, min_prob: float,
                    stop: frozenset[int]) -> tuple[list[int], list[float]]:
    """grow_draft's chain without its trie: at each depth the next token of the most
    paths still on the chain (ties to the first to appear, as the trie orders its
    children), while its share of all paths stays at least `min_prob`."""
    total, tokens, probs, alive = len(paths), [], [], paths
    while alive and len(tokens) < depth:
        d = len(tokens)
        counts: dict[int, int] = {}  # insertion order: the trie's child order
        for path in alive:
            if len(path) > d:
                counts[path[d]] = counts.get(path[d], 0) + 1
        if not counts:
            break
        token = max(counts, key=counts.__getitem__)  # the first of the most frequent
        prob = counts[token] / total
        if prob < min_prob:
            break
        tokens.append(token)
        probs.append(prob)
        if token in stop:
            break
        alive = [path for path in alive if len(path) > d and path[d] == token]
    return tokens, probs


def chain_lookup(index: SuffixIndex, context: list[int], k: int, caps: list[int],
                 min_prob: float, stop: frozenset[int]) -> ChainLookup:
    """The context's matches in `index` and the likeliest chain at each of the longest
    match lengths, at depth min(k, caps[m]): the reference `native_lookup` computes."""
    found = index.matches(context)
    chains = []
    for m in sorted({match.length for match in found}, reverse=True)[:MATCH_LENGTHS_TRIED]:
        depth = min(k, caps[m])
        if depth < 1:
            continue
        paths = [index.continuation(match.position, depth) for match in found if match.length >= m]
        tokens, probs = likeliest_chain(paths, depth, min_prob, stop)
        if tokens:
            chains.append(ChainCandidate(m, tokens, probs))
    return ChainLookup(found[0].length if found else 0, chains)


def native_lookup(own: array, store: SuffixIndex | None, context: list[int], k: int,
                  caps: list[int], min_prob: float, stop: frozenset[int], max_depth: int,
                  recent: int) -> dict[str, ChainLookup]:
    """chain_lookup over this request's own text and over a store's index, in one kernel
    call: `own` holds the context, which the kernel scans as the request's index (one
    open sequence, `recent` newest occurrences) would find it."""
    query = context[-max_depth:]
    index = ((store.tokens, store.offset, store.live_start, store.heads(query),
              [store.previous[n] for n in ANCHORS]) if store is not None else (None, 0, 0, [], []))
    local, shared = kernels.suffix_lookup(
        own, *index, list(ANCHORS), query, recent, store.recent if store is not None else 0, k,
        caps, min_prob, sorted(stop), MATCH_LENGTHS_TRIED)
    out = {"request": _chain_lookup(local)}
    if shared is not None:
        out["global"] = _chain_lookup(shared)
    return out


def _chain_lookup(found: tuple[int, list[tuple[int, list[int], list[float]]]]) -> ChainLookup:
    longest, chains = found
    return ChainLookup(longest, [ChainCandidate(*chain) for chain in chains])


def _trie(continuations: list[list[int]], stop: frozenset[int]):
    """Children per node and occurrence counts of a trie over the continuations;
    node 0 is the root. Nothing is grown past a stop token."""
    children: list[dict[int, int]] = [{}]
    counts = [len(continuations)]
    tokens = [-1]
    for path in continuations:
        node = 0
        for token in path:
            child = children[node].get(token)
            if child is None:
                child = len(counts)
                children[node][token] = child
                children.append({})
                counts.append(0)
                tokens.append(token)
            counts[child] += 1
            node = child
            if token in stop:
                break
    return children, counts, tokens


def grow_draft(continuations: list[list[int]], max_nodes: int, chain: bool,
               min_prob: float, stop: frozenset[int]) -> tuple[DraftTree, float]:
    """The best-first draft over the continuations' trie and its score.

    A child's probability never exceeds its parent's, so taking nodes in
    decreasing probability (ties to the earlier pushed) keeps the taken set
    ancestor-closed, in an order where every parent precedes its children.
    """
    children, counts, tokens = _trie(continuations, stop)
    total = counts[0]
    draft, score = DraftTree(), 0.0
    if not total:
        return draft, score
    heap: list[tuple[float, int, int, int]] = []  # (-probability, order, trie node, parent node)
    order = 0

    def push(trie_node: int, parent: int) -> None:
        nonlocal order
        kids = sorted(children[trie_node].values(), key=lambda c: -counts[c])
        for child in kids[:1] if chain else kids:
            heapq.heappush(heap, (-counts[child] / total, order, child, parent))
            order += 1

    push(0, -1)
    while heap and len(draft) < max_nodes:
        neg_prob, _, node, parent = heapq.heappop(heap)
        prob = -neg_prob
        if prob < min_prob:
            break
        parent_prob = 1.0 if parent == -1 else math.exp(draft.scores[parent])
        index = draft.add(tokens[node], parent, math.log(prob / parent_prob))
        score += prob
        push(node, index)
    return draft, score


class SuffixProposer(Proposer):
    name = "suffix"
    free = True  # a lookup per step; its per-request index follows the context like n-gram's

    def __init__(self, store: SuffixStore | None, eos_token_ids: frozenset[int],
                 tree_nodes: int = 0, settings: SuffixSettings = SuffixSettings(),
                 ignore_eos: bool = False, frequency: FrequencyDrafts | None = None,
                 max_k: int = 8) -> None:
        self.frequency = frequency  # sampled requests: chains drawn from the counts
        self.store = store  # None: only this request's own text (no Engine store)
        self.tree_nodes = tree_nodes
        self.settings = settings
        self.stop = frozenset() if ignore_eos else frozenset(eos_token_ids)
        depth = store.max_depth if store is not None else 32
        self.local = SuffixIndex(max_depth=depth)
        self._seen: list[int] = []
        self.last: ScoredDraft | None = None  # the latest proposal's draft, for stats and tests
        self.max_k = max_k  # the draft length `evidence` reads continuations for
        self._found: tuple[tuple, int, dict] | None = None  # (step, length, per-store reads)
        # Chain drafts only (no tree budget, argmaxed): the stores' reads are chain
        # lookups (chain_lookup), else every occurrence's continuation. With the kernels,
        # one call reads both stores and scans the context itself (`_own`) instead of
        # indexing it in `local`.
        self._chains_only = tree_nodes <= 0 and frequency is None
        self._native = self._chains_only and kernels.available()
        self._own = array("q")
        self._caps = [settings.depth_cap(m) for m in range(depth + 1)]  # per match length

    def _follow(self, tokens: list[int]) -> None:
        """Index the committed context: extend, or start over if it is not an extension."""
        old = len(self._seen)
        if tokens[:old] != self._seen:
            self.local, self._own, old = SuffixIndex(self.local.max_depth), array("q"), 0
            self._seen = []
        new = tokens[old:]
        self._seen.extend(new)
        if self._native:
            self._own.extend(new)
        elif old == 0:
            self.local.add(new, keep_open=True)
        else:
            self.local.extend(new)

    def _read(self, index: SuffixIndex, context: list[int], length: int):
        if self._chains_only:
            return chain_lookup(index, context, length, self._caps, self.settings.min_prob,
                                self.stop)
        return [(match.length, index.continuation(match.position, length))
                for match in index.matches(context)]

    def _stores(self, ctx: DraftContext, length: int) -> dict:
        """`_read` of each store at draft length `length`: a ChainLookup, or (match length,
        up to `length` following tokens) per occurrence. An adaptive step asks twice,
        `evidence` (at max_k) and then `propose`: the second reuses the first's reads,
        since a shorter draft is read from a longer one's prefix."""
        step = (len(ctx.tokens), tuple(ctx.tokens[-4:]))
        if self._found is not None and self._found[0] == step and length <= self._found[1]:
            return self._found[2]
        self._follow(ctx.tokens)
        if self._native:
            def both(index: SuffixIndex | None) -> dict:
                return native_lookup(self._own, index, ctx.tokens, length, self._caps,
                                     self.settings.min_prob, self.stop, self.local.max_depth,
                                     self.local.recent)
            found = self.store.read(both) if self.store is not None else both(None)
        else:
            found = {"request": self._read(self.local, ctx.tokens, length)}
            if self.store is not None:
                found["global"] = self.store.read(
                    lambda index: self._read(index, ctx.tokens, length))
        self._found = (step, length, found)
        return found

    def propose(self, ctx: DraftContext, k: int) -> Proposal:
        self.last = None
        if k <= 0:
            return Proposal.empty()
        if self._chains_only:
            best = self.last = self._best_chain(ctx, k)
            return Proposal(torch.tensor(best.tokens)) if best else Proposal.empty()
        nodes = ctx.tree_budget(self.tree_nodes)
        chain = nodes <= 0
        best: ScoredDraft | None = None
        for source, found in self._stores(ctx, k).items():
            lengths = sorted({m for m, _ in found}, reverse=True)[:MATCH_LENGTHS_TRIED]
            for m in lengths:
                depth = min(k, self._caps[m])
                if depth < 1:
                    continue
                paths = [path[:depth] for length, path in found if length >= m]
                draft, score = grow_draft(paths, depth if chain else nodes, chain,
                                          self.settings.min_prob, self.stop)
                if len(draft) and (best is None or score > best.score):
                    best = ScoredDraft(draft.tokens, score, m, source, draft, paths)
        self.last = best
        if best is None:
            return Proposal.empty()
        if chain and self.frequency is not None:
            # The best-scoring store and match length, drawn from rather than argmaxed.
            depth = min(k, self._caps[best.match_length])
            return self.frequency.chain(best.paths, depth, self.stop, self.settings.min_prob)
        if chain:  # grow_draft took one child a node: the draft is its own path
            return Proposal(torch.tensor(best.tokens, dtype=torch.long))
        tree = best.tree.subtree(list(range(len(best.tree))))
        if tree.max_depth == len(tree):  # a single path: verify it as a chain
            return Proposal(tree.tokens)
        return as_proposal(tree)

    def _best_chain(self, ctx: DraftContext, k: int) -> ScoredDraft | None:
        """The best-scoring chain of either store (the request's wins ties)."""
        best = None
        for source, lookup in self._stores(ctx, k).items():
            for chain in lookup.chains:
                depth = min(k, self._caps[chain.match_length])
                score = sum(chain.probs[:depth])
                if best is None or score > best.score:
                    best = ScoredDraft(chain.tokens[:depth], score, chain.match_length, source)
        return best

    def evidence(self, ctx: DraftContext) -> Evidence:
        """The longest match either store holds, keyed like n-gram lookup's."""
        found = self._stores(ctx, self.max_k)
        if self._chains_only:
            longest = max(lookup.longest for lookup in found.values())
        else:
            longest = max((m for matches in found.values() for m, _ in matches), default=0)
        return match_evidence(longest)

    def finished(self, ctx: DraftContext) -> None:
        if self.store is not None:
            self.store.add(ctx.tokens[ctx.num_prompt:])


@register("suffix")
def _build(setup: ProposerSetup) -> Proposer:
    spec = setup.spec
    return SuffixProposer(setup.resources.get("suffix_store"), setup.target.eos_token_ids,
                          tree_nodes=spec.tree,
                          settings=SuffixSettings(spec.suffix_factor, spec.suffix_offset,
                                                  spec.suffix_min_prob),
                          ignore_eos=setup.sampling.ignore_eos,
                          frequency=FrequencyDrafts.of(setup), max_k=max(1, spec.k))
