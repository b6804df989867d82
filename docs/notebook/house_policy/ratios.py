"""Median per-prompt ratios between configurations of one `verispec bench` run (its
results.json), per workload: how `auto` (or any config) compares with a reference run
side by side on the same prompts, next to the A/A ratio of two identical configs.

    python docs/notebook/house_policy/ratios.py RESULTS_DIR [CONFIG/REFERENCE ...]
    python docs/notebook/house_policy/ratios.py /tmp/hp/auto_base_mixed auto/ngram+auto \\
        ngram+auto+ngram_min=1/ngram+auto ngram+auto/none auto/none

Ran at commits 3697828 and the policy branch (9ea1048-0827456), before issue 42's folder
move; kept as a record, not maintained: it may not run against today's modules.
"""
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def main() -> int:
    data = json.loads((Path(sys.argv[1]) / "results.json").read_text())
    pairs = [p.split("/") for p in sys.argv[2:]]
    rate = defaultdict(dict)  # workload -> prompt -> config -> tokens per second
    tau = defaultdict(lambda: defaultdict(list))
    for r in data["records"]:
        rate[r["workload"]][(r["prompt_id"], r["config"])] = r["tokens"] / r["seconds"]
        tau[r["workload"]][r["config"]].append(r["tokens"] / max(r["target_forwards"], 1))
    print("| workload | " + " | ".join(f"{a} / {b}" for a, b in pairs) + " |")
    print("|---" * (len(pairs) + 1) + "|")
    for workload, rates in rate.items():
        prompts = sorted({p for p, _ in rates})
        cells = []
        for a, b in pairs:
            ratios = [rates[(p, a)] / rates[(p, b)] for p in prompts
                      if (p, a) in rates and (p, b) in rates]
            cells.append(f"{statistics.median(ratios):.3f}" if ratios else "-")
        print(f"| {workload} | " + " | ".join(cells) + " |")
    print()
    configs = sorted({c for w in tau.values() for c in w})
    print("| workload | " + " | ".join(f"tau {c}" for c in configs) + " |")
    print("|---" * (len(configs) + 1) + "|")
    for workload, by in tau.items():
        print(f"| {workload} | " + " | ".join(
            f"{statistics.median(by[c]):.2f}" if by[c] else "-" for c in configs) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
