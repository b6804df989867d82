"""Does the fast tier reach every line of the mechanism and the policy that the full suite does?

    python scripts/tier_coverage.py            # runs both tiers under coverage (the full suite's time)
    python scripts/tier_coverage.py --reuse    # compares the data files of an earlier run

The full suite is the fast tier plus the slow one, so the lines only the full suite reaches are
the lines the slow tier reaches and the fast tier does not. They are listed per file; the exit
status is 1 when there are any. Data files: .coverage.fast and .coverage.slow (git ignores them).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from coverage import CoverageData

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("verispec/step", "verispec/policy")
TIERS = {"fast": "not slow", "slow": "slow"}


def run_tier(tier: str) -> None:
    cov = [f"--cov={package}" for package in PACKAGES]
    env = {**os.environ, "COVERAGE_FILE": str(ROOT / f".coverage.{tier}")}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", TIERS[tier],
               *cov, "--cov-report=", "tests"]
    print("$", " ".join(command), flush=True)
    done = subprocess.run(command, cwd=ROOT, env=env)
    if done.returncode not in (0, 5):
        sys.exit(f"the {tier} tier failed (exit {done.returncode}); its coverage would mislead")


def lines_of(tier: str) -> dict[str, set[int]]:
    data = CoverageData(basename=str(ROOT / f".coverage.{tier}"))
    data.read()
    return {str(Path(name).resolve().relative_to(ROOT)): set(data.lines(name) or ())
            for name in data.measured_files()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reuse", action="store_true",
                        help="compare the data files of an earlier run instead of running")
    args = parser.parse_args()
    if not args.reuse:
        for tier in TIERS:
            run_tier(tier)
    fast, slow = lines_of("fast"), lines_of("slow")
    missing = {name: sorted(lines - fast.get(name, set())) for name, lines in slow.items()}
    missing = {name: lines for name, lines in missing.items() if lines}
    reached = sum(len(lines) for lines in fast.values())
    print(f"fast tier: {reached} lines of {', '.join(PACKAGES)} in {len(fast)} files")
    if not missing:
        print("every line the full suite reaches there, the fast tier reaches too")
        return 0
    for name, lines in sorted(missing.items()):
        print(f"only the slow tier reaches {name}: lines {', '.join(map(str, lines))}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
