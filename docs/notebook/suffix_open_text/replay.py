# Ran at commit 477e509 (2026-12-03); kept as a record, not maintained: modules may have moved since.
"""Suffix drafts on open text without the clock (issue 20, docs/notebook/suffix_open_text.md).

Greedy output is fixed, a suffix draft is a function of the context and the stores, and
greedy verification keeps the draft's match with that output: so how many tokens a pass
commits, and how often a draft's first token is right, are exact without timing anything.

    verispec warm-suffix --material 8000 --kinds chat,creative --tokens 600000 \\
        --suffix-cache store.npz --suffix-max-tokens 1000000
    python docs/notebook/suffix_open_text/replay.py tau store.npz --sizes 0,100000,200000,600000
    python docs/notebook/suffix_open_text/replay.py calibration store.npz
    python docs/notebook/suffix_open_text/replay.py policy store.npz --sizes 200000,600000

`tau`: every step drafts the chain the proposer proposes (k 8), store cut to each size.
`calibration`: for every candidate draft (store, match length m, n occurrences, c of them
agreeing on the first token), how often that token is the target's, by m and n.
`policy`: the engine's adaptive-k policy (`AdaptiveKPolicy`, evidence and all) drafting
with the real proposer, each pass priced on a cost curve T(n)/T(1) plus a host overhead per
speculative step (measured: docs/notebook/suffix_open_text.md).
"""
from __future__ import annotations

import argparse
import collections
import json
import statistics
from pathlib import Path

from verispec.economics import CostModel
from verispec.plan import AdaptiveKPolicy, Outcome, PlanContext
from verispec.policy import AdaptiveK
from verispec.proposers.base import DraftContext
from verispec.proposers.suffix import MATCH_LENGTHS_TRIED, SuffixProposer
from verispec.proposers.suffix_store import SuffixStore

CURVE = (1.0, 1.15, 1.25, 1.40, 1.85, 2.0, 2.15, 2.3, 2.4)  # T(n)/T(1), n = 1..9: the
# verispec profile figures of the quiet machine with the 2-row step as the engine measured it


def references(path: Path, workloads=("chat", "creative"), limit=12, max_new=128) -> list[dict]:
    """The target's greedy answers to the bench prompts, cached in `path`."""
    if path.exists():
        return [json.loads(line) for line in path.read_text().splitlines()]
    from verispec import Engine, SamplingParams, SpecConfig
    from verispec.bench.workloads import load_workload

    engine = Engine("default")
    out = []
    for name in workloads:
        for p in load_workload(name, limit):
            ids = engine.encode_messages(list(p.messages))
            answer = engine.generate(ids, SamplingParams(max_new_tokens=max_new),
                                     SpecConfig("ngram", k=8, adaptive=True)).token_ids
            out.append({"id": p.id, "kind": name, "prompt": ids, "response": answer})
    path.write_text("".join(json.dumps(r) + "\n" for r in out))
    return out


def load_store(path: str, tokens: int | None = None) -> SuffixStore:
    full = SuffixStore(max_requests=1 << 20, max_tokens=1 << 22)
    full.load(path)
    store, total = SuffixStore(max_requests=1 << 20, max_tokens=1 << 22), 0
    for sequence in full.sequences():
        if tokens is not None and total >= tokens:
            break
        store.add(sequence)
        total += len(sequence)
    return store


def chain_tau(ref: dict, store: SuffixStore, k: int = 8) -> float:
    proposer = SuffixProposer(store, frozenset({2}))
    prompt, out = ref["prompt"], ref["response"]
    pos = passes = 0
    while pos < len(out):
        room = min(k, len(out) - pos - 1)
        ctx = DraftContext(prompt + out[:pos], len(prompt), tree_nodes=0)
        draft = proposer.propose(ctx, room).tokens.tolist() if room > 0 else []
        accepted = 0
        while accepted < len(draft) and draft[accepted] == out[pos + accepted]:
            accepted += 1
        pos, passes = pos + accepted + 1, passes + 1
    return len(out) / passes


def policy_run(ref: dict, store: SuffixStore, overhead: float, k_cap: int = 8) -> tuple[float, float]:
    """(modelled speedup over plain decoding, tokens per pass) under the engine's policy."""
    proposer = SuffixProposer(store, frozenset({2}))
    policy = AdaptiveKPolicy(AdaptiveK(CostModel(verify_overhead=0.12)), 0)
    prompt, out = ref["prompt"], ref["response"]
    tokens, done, time, passes = list(prompt), 0, 0.0, 0
    while done < len(out):
        ctx = DraftContext(tokens, len(prompt), tree_nodes=0)
        plan = policy.plan(PlanContext(ctx, proposer), min(k_cap, len(out) - done - 1))
        draft = proposer.propose(ctx, plan.k).tokens.tolist() if plan.k else []
        accepted = 0
        for token, actual in zip(draft, out[done:]):
            if token != actual:
                break
            accepted += 1
        seconds = CURVE[len(draft)] + (overhead if plan.k else 0.0)
        policy.observe(plan, Outcome(len(draft), accepted, verify_seconds=0.006 * seconds))
        tokens += out[done:done + accepted + 1]
        done, passes, time = done + accepted + 1, passes + 1, time + seconds
    return len(out) / time, len(out) / passes


def calibration(refs: list[dict], store: SuffixStore) -> None:
    def bucket(value: int, edges: tuple[int, ...]) -> int:
        return max(e for e in edges if value >= e)

    table = collections.defaultdict(lambda: [0, 0, 0.0])
    for ref in refs:
        proposer = SuffixProposer(store, frozenset({2}))
        prompt, out = ref["prompt"], ref["response"]
        for pos in range(len(out) - 1):
            ctx = DraftContext(prompt + out[:pos], len(prompt), tree_nodes=0)
            for found in proposer._candidates(ctx, 1).values():
                for m in sorted({m for m, _ in found}, reverse=True)[:MATCH_LENGTHS_TRIED]:
                    nxt = collections.Counter(p[0] for length, p in found if length >= m and p)
                    if not nxt:
                        continue
                    token, count = nxt.most_common(1)[0]
                    n = sum(nxt.values())
                    cell = table[(bucket(m, (1, 2, 3, 4, 6, 9, 16)), bucket(n, (1, 2, 4, 11)))]
                    cell[0] += token == out[pos]
                    cell[1] += 1
                    cell[2] += count / n
    print("| m >= | n >= | candidates | first token right | mean share c/n | right / share |")
    print("|---|---|---|---|---|---|")
    for (m, n), (right, total, share) in sorted(table.items()):
        if total >= 15:
            print(f"| {m} | {n} | {total} | {right / total:.2f} | {share / total:.2f} | "
                  f"{right / share:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["tau", "calibration", "policy"])
    ap.add_argument("store", help="a --suffix-cache file (verispec warm-suffix)")
    ap.add_argument("--references", default="references.jsonl",
                    help="cache of the target's greedy answers to the bench prompts")
    ap.add_argument("--sizes", default="0,100000,200000,400000,600000")
    ap.add_argument("--overhead", type=float, default=0.08)
    args = ap.parse_args()
    refs = references(Path(args.references))
    if args.mode == "calibration":
        calibration(refs, load_store(args.store))
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    for size in sizes:
        store = load_store(args.store, size)
        for kind in ("chat", "creative"):
            mine = [r for r in refs if r["kind"] == kind]
            if args.mode == "tau":
                taus = [chain_tau(r, store) for r in mine]
                print(f"store {store.stats().tokens:>7} tokens  {kind:8s} tau median "
                      f"{statistics.median(taus):.3f} mean {statistics.mean(taus):.3f}")
            else:
                rows = [policy_run(r, store, args.overhead) for r in mine]
                print(f"store {store.stats().tokens:>7} tokens  {kind:8s} modelled speedup "
                      f"{statistics.median(r[0] for r in rows):.3f} tau "
                      f"{statistics.median(r[1] for r in rows):.3f}")


if __name__ == "__main__":
    main()
