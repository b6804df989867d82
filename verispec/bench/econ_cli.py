"""`verispec calc` and `verispec simulate`: the economics of speculative decoding
from the command line. `verispec/cli/main.py` mounts these through `add_subcommands`;
`python -m verispec.bench.econ_cli` runs them standalone."""
from __future__ import annotations

import argparse
import json
import math
import sys

from verispec.bench.calculator import ceiling, expected_speedup, expected_tokens, optimal_k
from verispec.bench.simulate import simulate, spread_by_rounds
from verispec.policy.economics import CostModel, load_profile

_DEFAULT_OVERHEAD = 0.1
_CEILING_NOTE = {False: "max(1, 1 / (draft cost + overhead))",
                 True: "best measured point or 1 / (draft cost + profile's last slope)"}

_HELP_ALPHA = "acceptance rate: probability the target accepts each drafted token, in [0, 1)"
_HELP_K = "draft length: tokens proposed per target pass (0 = plain decoding)"
_HELP_DRAFT = ("draft cost per drafted token, relative to one plain target decode step "
               "(~0 for n-gram lookup, 0.05-0.2 for a small draft model; default: 0, or the profile's)")
_HELP_OVERHEAD = (f"extra target time per extra verified position, as a fraction of one decode step: "
                  f"T(k+1)/T(1) = 1 + overhead*k (default {_DEFAULT_OVERHEAD})")
_HELP_PROFILE = 'measured cost profile JSON {"n": [1..N], "seconds": [...]} from `verispec profile`'

_CALC_EPILOG = """\
example:
  verispec calc --alpha 0.8 --k 4 --verify-overhead 0.1
  -> 3.36 tokens per target pass, 2.40x; k=6 would give 2.47x; no k beats 10x.
speedup = E / (k*c + T(k+1)/T(1)),  E = (1 - alpha^(k+1)) / (1 - alpha)  (Leviathan et al. 2023)
"""

_SIM_EPILOG = """\
example:
  verispec simulate --alpha 0.75 --k 4 --rounds 24 --seed 0 --plot speedup.png
each round accepts drafts until the first rejection (each with probability alpha),
then the target adds one token; the table shows how noisy a short benchmark is.
"""


def _add_cost_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--alpha", type=float, required=True, help=_HELP_ALPHA)
    p.add_argument("--k", type=int, default=4, help=_HELP_K + " (default 4)")
    p.add_argument("--draft-cost", type=float, default=None, metavar="C", help=_HELP_DRAFT)
    group = p.add_mutually_exclusive_group()
    group.add_argument("--verify-overhead", type=float, default=None, metavar="O", help=_HELP_OVERHEAD)
    group.add_argument("--profile", default=None, metavar="FILE", help=_HELP_PROFILE)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def _cost_from_args(args: argparse.Namespace) -> CostModel:
    if args.profile is not None:
        return load_profile(args.profile, draft_cost=args.draft_cost)
    overhead = _DEFAULT_OVERHEAD if args.verify_overhead is None else args.verify_overhead
    draft = 0.0 if args.draft_cost is None else args.draft_cost
    return CostModel(draft_cost=draft, verify_overhead=overhead)


def _describe_cost(cost: CostModel, args: argparse.Namespace) -> str:
    if cost.profile is not None:
        return f"draft cost {cost.draft_cost:g}/token, profile {args.profile} (n <= {len(cost.profile)})"
    return f"draft cost {cost.draft_cost:g}/token, verify overhead {cost.verify_overhead:g}/position"


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _fmt_x(x: float) -> str:
    return f"{x:.2f}x" if math.isfinite(x) else "unbounded"


def _error(command: str, exc: Exception) -> int:
    print(f"verispec {command}: error: {exc}", file=sys.stderr)
    return 2


def run_calc(args: argparse.Namespace) -> int:
    try:
        cost = _cost_from_args(args)
        tokens = expected_tokens(args.alpha, args.k)
        speedup = expected_speedup(args.alpha, args.k, cost)
        best = optimal_k(args.alpha, cost, args.k_max)
        top = ceiling(cost)
    except (ValueError, OSError) as exc:
        return _error("calc", exc)
    if args.json:
        print(json.dumps({
            "alpha": args.alpha, "k": args.k, "draft_cost": cost.draft_cost,
            "verify_overhead": cost.verify_overhead, "profile": args.profile,
            "expected_tokens": tokens, "expected_speedup": speedup,
            "optimal_k": best.k, "optimal_speedup": best.speedup, "k_max": args.k_max,
            "ceiling": _finite_or_none(top),
        }))
        return 0
    rows = [
        ("alpha, k", f"{args.alpha:g}, {args.k}"),
        ("cost model", _describe_cost(cost, args)),
        ("E[tokens per target pass]", f"{tokens:.3f}"),
        ("expected speedup", _fmt_x(speedup)),
        (f"optimal k (0..{args.k_max})", f"{best.k}  ({_fmt_x(best.speedup)})"),
        ("ceiling (alpha -> 1, any k)", f"{_fmt_x(top)}  ({_CEILING_NOTE[cost.profile is not None]})"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    if speedup < 1.0:
        print(f"\nspeculation is slower than plain decoding here; use k={best.k} or a cheaper drafter.")
    return 0


def run_simulate(args: argparse.Namespace) -> int:
    try:
        cost = _cost_from_args(args)
        result = simulate(args.alpha, args.k, args.rounds, args.seed, cost)
        spread = spread_by_rounds(args.alpha, args.k, trials=args.trials, seed=args.seed)
        plot = None
        if args.plot is not None:
            from verispec.bench.simulate import plot_speedup

            plot = str(plot_speedup(args.plot, args.alpha, cost))
    except (ValueError, OSError) as exc:
        return _error("simulate", exc)
    if args.json:
        print(json.dumps({
            "alpha": args.alpha, "k": args.k, "rounds": result.rounds, "seed": args.seed,
            "tokens_per_pass": result.tokens_per_pass, "theoretical": result.theoretical,
            "speedup": result.speedup, "theoretical_speedup": result.theoretical_speedup,
            "spread": [vars(row) for row in spread], "trials": args.trials, "plot": plot,
        }))
        return 0
    print(f"alpha {args.alpha:g}, k {args.k}, {result.rounds} rounds, seed {args.seed}; {_describe_cost(cost, args)}")
    print(f"{'':<24}{'measured':>10}{'theory':>10}")
    print(f"{'tokens per target pass':<24}{result.tokens_per_pass:>10.3f}{result.theoretical:>10.3f}")
    print(f"{'speedup':<24}{result.speedup:>9.2f}x{result.theoretical_speedup:>9.2f}x")
    print(f"\ntokens per pass across {args.trials} independent runs of each length:")
    print(f"{'rounds':>8}{'mean':>9}{'std':>9}{'theory std':>12}")
    for row in spread:
        print(f"{row.rounds:>8}{row.mean:>9.3f}{row.std:>9.3f}{row.theoretical_std:>12.3f}")
    if plot is not None:
        print(f"\nplot written to {plot}")
    return 0


def add_subcommands(subparsers: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    calc = subparsers.add_parser(
        "calc", help="expected tokens per pass, speedup, best k and ceiling for given alpha and k",
        description="Closed-form economics of speculative decoding for one (alpha, k, cost).",
        epilog=_CALC_EPILOG, formatter_class=fmt)
    _add_cost_args(calc)
    calc.add_argument("--k-max", type=int, default=32, help="largest k searched for the optimum (default 32)")
    calc.set_defaults(func=run_calc)

    sim = subparsers.add_parser(
        "simulate", help="Monte-Carlo the accept/reject process and compare it with theory",
        description="Seeded Monte-Carlo of speculative rounds against the closed forms.",
        epilog=_SIM_EPILOG, formatter_class=fmt)
    _add_cost_args(sim)
    sim.add_argument("--rounds", type=int, default=24, help="speculative rounds in the main run (default 24)")
    sim.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    sim.add_argument("--trials", type=int, default=400, help="independent runs per row of the spread table (default 400)")
    sim.add_argument("--plot", default=None, metavar="FILE.png", help="also draw expected speedup vs k to this PNG")
    sim.set_defaults(func=run_simulate)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="verispec", description="Speculative-decoding economics.")
    add_subcommands(parser.add_subparsers(dest="command", required=True))
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
