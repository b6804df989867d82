"""The clock-free replay's table (`python -m verispec.bench.replay`) on stored greedy
outputs, so that two checkouts replay the very same (prompt, output) pairs: the first
run generates them with the default model and saves them to OUTPUTS; later runs, under
any checkout's PYTHONPATH, only replay. A replay is a function of (prompt, output,
slope, k), so equal tables mean equal tokens per pass. Its loop is `python -m
verispec.bench.replay`'s, repeated here because an older checkout has no entry point that
takes stored outputs.

    PYTHONPATH=BASE python docs/notebook/house_policy/replay_table.py /tmp/hp/outputs.json
    PYTHONPATH=.    python docs/notebook/house_policy/replay_table.py /tmp/hp/outputs.json
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

from verispec.bench.replay import STATIC_KS, replay


def outputs(path: Path) -> dict:
    if path.exists():
        return json.loads(path.read_text())
    from verispec.bench.replay import _outputs

    found = _outputs(argparse.Namespace(model="default", dtype="auto", backend="auto",
                                        workload="all", limit=6, max_new_tokens=160))
    path.write_text(json.dumps(found))
    return json.loads(path.read_text())


def main() -> int:
    found = outputs(Path(sys.argv[1]))
    slopes = [float(s) for s in (sys.argv[2] if len(sys.argv) > 2 else "0.01,0.03,0.06").split(",")]
    print("| c | workload | " + " | ".join(f"k={k}" for k in STATIC_KS)
          + " | adaptive | best static | adaptive / best | pooled / best | adaptive passes |")
    print("|---" * (len(STATIC_KS) + 7) + "|")
    for slope in slopes:
        for workload, pairs in found.items():
            def median(k, keyed=True):
                return statistics.median(replay(p, o, slope, k, keyed=keyed).speedup
                                         for p, o in pairs)
            static = {k: median(k) for k in STATIC_KS}
            best = max(static, key=static.get)
            adaptive, pooled = median(None), median(None, keyed=False)
            passes = sum(replay(p, o, slope, None).passes for p, o in pairs)
            print(f"| {slope} | {workload} | " + " | ".join(f"{v:.2f}" for v in static.values())
                  + f" | {adaptive:.4f} | k={best} | {adaptive / static[best]:.3f} "
                  f"| {pooled / static[best]:.3f} | {passes} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
