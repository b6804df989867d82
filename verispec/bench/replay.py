"""Exercise 3 without the clock: n-gram lookup at every static k and with adaptive k,
replayed on the target's own greedy outputs under a linear verification cost.

Why. On a shared 2-core machine the same (prompt, config) runs further apart
between repeats than the differences between good draft lengths, so "close to
the best static k" is unprovable by timing.
Greedy decoding removes every other source of noise: the target's output is
fixed, an n-gram draft is a function of the committed context, and its accepted
prefix is its match with that output (exactly what greedy verification keeps).
What remains is time, which this module models as T(n) = T(1) * (1 + c * (n - 1))
for a forward over n positions, with c measured on the machine (`verispec
profile`; the values the bench measured are in docs/notebook/rounds.md, round 6).

The replay drives the engine's own policy through its interface (`plan`,
`observe`: evidence, shadow guesses and all) with the real n-gram proposer, and
feeds it the modelled step times, so its choices react to the same cost curve
the static runs are scored with. `tests/test_bench.py` checks that a replayed static run
commits exactly what the engine commits.

    python -m verispec.bench.replay --workload all --limit 6 --max-new-tokens 160 \\
        --slopes 0.01,0.03,0.06
"""
from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass

from ..economics import CostModel
from ..plan import Outcome, PlanContext
from ..policy import AdaptiveK, FixedK
from ..proposers.base import DraftContext
from ..proposers.ngram import NgramProposer

STATIC_KS = (1, 2, 4, 6, 8, 10)


@dataclass(frozen=True)
class Replay:
    tokens: int  # output tokens committed
    passes: int  # target forwards
    drafted: int  # draft tokens verified
    time: float  # modelled, in units of T(1)

    @property
    def speedup(self) -> float:
        """Over plain decoding, which needs one T(1) pass per token."""
        return self.tokens / self.time


def replay(prompt: list[int], output: list[int], slope: float, k: int | None,
           k_cap: int = 10, ngram: tuple[int, int] = (1, 4), keyed: bool = True) -> Replay:
    """Decode `output` again from `prompt` with n-gram drafts of length k (None:
    adaptive, capped at k_cap); a draft keeps its prefix that matches `output`.
    `keyed` False hides the evidence from the policy (one pooled estimate).

    The policy is the engine's own (verispec.policy: `FixedK` or `AdaptiveK`), planned
    and taught through its interface as a request is; only the target is replaced, by
    `output`, and the clock, by the modelled T(n)."""
    proposer = NgramProposer(*ngram, frozenset()) if keyed else _Unkeyed(*ngram, frozenset())
    policy = FixedK() if k is not None else AdaptiveK(k_cap, CostModel(verify_overhead=slope))
    tokens, done, passes, drafted, time = list(prompt), 0, 0, 0, 0.0
    while done < len(output):
        ctx = DraftContext(tokens, len(prompt), tree_nodes=0)
        # The bonus token needs one slot, as in Sequence.room().
        plan = policy.plan(PlanContext(ctx, proposer),
                           min(k_cap if k is None else k, len(output) - done - 1))
        draft = proposer.propose(ctx, plan.k).tokens.tolist() if plan.k else []
        shadow = proposer.propose(ctx, 1).tokens.tolist() if plan.shadow and not plan.k else []
        accepted = 0
        for token, actual in zip(draft, output[done:]):
            if token != actual:
                break
            accepted += 1
        seconds = 1.0 + slope * len(draft)
        policy.observe(plan, Outcome(len(draft), len(draft), accepted, accepted < len(draft),
                                     shadow=int(shadow[0] == output[done]) if shadow else None,
                                     verify_seconds=seconds))
        tokens += output[done:done + accepted + 1]
        done += accepted + 1
        passes, drafted, time = passes + 1, drafted + len(draft), time + seconds
    return Replay(len(output), passes, drafted, time)


class _Unkeyed(NgramProposer):
    """n-gram lookup that keeps its evidence to itself: the policy pools every step."""

    def evidence(self, ctx: DraftContext) -> None:
        return None


def _outputs(args) -> dict[str, list[tuple[list[int], list[int]]]]:
    from tqdm import tqdm

    from .. import Engine, SamplingParams, SpecConfig
    from .workloads import load_workload, parse_workloads

    engine = Engine(args.model, dtype=args.dtype, backend=args.backend)
    sampling = SamplingParams(max_new_tokens=args.max_new_tokens)
    found: dict[str, list[tuple[list[int], list[int]]]] = {}
    names = parse_workloads(args.workload)
    prompts = [p for name in names for p in load_workload(name, limit=args.limit)]
    for p in tqdm(prompts, desc="greedy outputs", unit="prompt"):
        ids = engine.encode_messages(list(p.messages))
        # Lossless, so any proposer yields plain greedy output; this one is quick.
        out = engine.generate(ids, sampling, SpecConfig("ngram", k=8, adaptive=True))
        found.setdefault(p.workload, []).append((ids, out.token_ids))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m verispec.bench.replay",
        description="Replay n-gram lookup at every static k and with adaptive k on the "
                    "target's greedy outputs under a linear verification cost, and compare "
                    "adaptive with the best static k (exercise 3, without timing noise).")
    parser.add_argument("--workload", default="all", help="comma list of workloads, or all")
    parser.add_argument("--limit", type=int, default=6, help="prompts per workload")
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--slopes", default="0.01,0.03,0.06",
                        help="comma list of c in T(n) = T(1) (1 + c (n - 1))")
    parser.add_argument("--model", default="default")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--backend", default="auto")
    args = parser.parse_args(argv)
    slopes = [float(s) for s in args.slopes.split(",")]
    outputs = _outputs(args)
    print("| c | workload | " + " | ".join(f"k={k}" for k in STATIC_KS)
          + " | adaptive | best static | adaptive / best | pooled / best |")
    print("|---" * (len(STATIC_KS) + 6) + "|")
    for slope in slopes:
        for workload, pairs in outputs.items():
            def median(k, keyed=True):
                return statistics.median(replay(p, o, slope, k, keyed=keyed).speedup
                                         for p, o in pairs)
            static = {k: median(k) for k in STATIC_KS}
            best = max(static, key=static.get)
            adaptive, pooled = median(None), median(None, keyed=False)
            print(f"| {slope} | {workload} | " + " | ".join(f"{v:.2f}" for v in static.values())
                  + f" | {adaptive:.2f} | k={best} | {adaptive / static[best]:.3f} "
                  f"| {pooled / static[best]:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
