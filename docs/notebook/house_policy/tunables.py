"""Each adaptive-k tunable (verispec.policy's constants) at half and at twice its default,
on the clock-free replay of the bench's workloads (stored greedy outputs, see
replay_table.py): the median over prompts of adaptive k's modelled speedup, relative to
the default's, per workload and slope. A default that sits on a plateau reads 1.000 on
both sides; one that matters shows which way it would move.

    PYTHONPATH=. python docs/notebook/house_policy/tunables.py /tmp/hp/outputs.json [NAMES]

Ran at commits 3697828 and the policy branch (9ea1048-0827456), before issue 42's folder
move; kept as a record, not maintained: it may not run against today's modules.
"""
import json
import statistics
import sys
from pathlib import Path

from verispec import economics, policy
from verispec.bench.replay import replay

# (module, constant): values tried. EXPLORE_EVERY 0 never explores, PLAIN_RECHECK_GAIN 0
# never re-times T(1). (Before the change detector went, its CHANGE_P was varied too: 1e-300,
# which never resets, and 1e-2; see docs/notebook/house_policy.md.)
VARIED = {(policy, "HALF_LIFE"): (8.0, 32.0), (policy, "PRIOR_ALPHA"): (0.25, 0.75),
          (policy, "PRIOR_WEIGHT"): (0.5, 2.0),
          (policy, "EXPLORE_EVERY"): (0, 8, 32), (policy, "PROBE_K"): (1, 4),
          (policy, "PROBE_EVERY"): (4, 16), (policy, "PROBE_LIMIT"): (32, 128),
          (economics, "PLAIN_RECHECK_GAIN"): (0.0, 4.0)}
ONLY = sys.argv[2].split(",") if len(sys.argv) > 2 else None  # names to vary, default all


def medians(found: dict, slopes: list[float]) -> dict:
    return {(w, s): statistics.median(replay(p, o, s, None).speedup for p, o in pairs)
            for w, pairs in found.items() for s in slopes}


def main() -> int:
    found = json.loads(Path(sys.argv[1]).read_text())
    slopes = [0.01, 0.03, 0.06]
    default = medians(found, slopes)
    keys = list(default)
    print("| tunable (default) | value | " + " | ".join(f"{w} c={s}" for w, s in keys)
          + " | mean |")
    print("|---" * (len(keys) + 3) + "|")
    for (module, name), values in VARIED.items():
        if ONLY is not None and name not in ONLY:
            continue
        kept = getattr(module, name)
        for value in values:
            setattr(module, name, value)
            got = medians(found, slopes)
            ratios = [got[key] / default[key] for key in keys]
            print(f"| {name} ({kept}) | {value} | " + " | ".join(f"{r:.3f}" for r in ratios)
                  + f" | {statistics.mean(ratios):.3f} |", flush=True)
        setattr(module, name, kept)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
