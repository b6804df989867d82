"""The adaptive policy's host work per step, without a model: the clock-free replay
(n-gram lookup's drafts, the policy's plan and observe) over scripts/replay_equivalence.py's
seeded synthetic pairs, timed in process, microseconds per replayed step (median of
ROUNDS). Run it under each checkout's PYTHONPATH, interleaved, under cpulock -x:

    PYTHONPATH=BASE python docs/notebook/house_policy/policy_host.py

Ran at commits 3697828 and the policy branch (9ea1048-0827456), before issue 42's folder
move; kept as a record, not maintained: it may not run against today's modules.
"""
import os
import statistics
import sys
import time
from pathlib import Path

# The checkout's own copy of the cases (the same seeded pairs in every checkout).
sys.path.insert(0, str(Path(os.environ.get("PYTHONPATH", ".")).resolve() / "scripts"))
from replay_equivalence import cases  # noqa: E402

from verispec.bench.replay import replay  # noqa: E402


def main() -> int:
    pairs = list(cases())
    rounds = int(os.environ.get("ROUNDS", "5"))
    per_step = []
    for _ in range(rounds):
        steps, t0 = 0, time.perf_counter()
        for prompt, output in pairs:
            steps += replay(prompt, output, 0.03, None).passes
        per_step.append(1e6 * (time.perf_counter() - t0) / steps)
    print(f"{os.environ.get('PYTHONPATH', '.')}: {statistics.median(per_step):.1f} us per step "
          f"(rounds {', '.join(f'{v:.1f}' for v in per_step)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
