"""Does a refactor change what the adaptive controller chooses? Replays n-gram drafting
(verispec.bench.replay.replay, the real AdaptiveK) on seeded synthetic prompt/output pairs
that copy spans and write fresh tokens, at every static k and adaptive (keyed and pooled),
and prints every result as JSON, floats in full. Run it on two checkouts and compare:

    python scripts/replay_equivalence.py OLD_CHECKOUT > before.json
    python scripts/replay_equivalence.py . > after.json
    cmp before.json after.json && echo identical

No model, no clock: seconds, not hours, where the real replay needs the target's outputs.
"""
from __future__ import annotations

import json
import random
import sys


def cases(seed: int = 0, count: int = 40):
    rng = random.Random(seed)
    for _ in range(count):
        vocab = rng.choice([20, 50, 400])
        prompt = [rng.randrange(vocab) for _ in range(rng.randrange(20, 200))]
        output: list[int] = []
        while len(output) < 160:
            if rng.random() < 0.5:
                start = rng.randrange(len(prompt))
                output += prompt[start:start + rng.randrange(1, 12)]
            else:
                output += [rng.randrange(vocab) for _ in range(rng.randrange(1, 8))]
        yield prompt, output[:160]


def main() -> int:
    sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else ".")
    from verispec.bench.replay import replay

    results = []
    for prompt, output in cases():
        for slope in (0.01, 0.03, 0.06):
            for k in (1, 2, 4, 6, 8, 10, None):
                for keyed in ((True, False) if k is None else (True,)):
                    r = replay(prompt, output, slope, k, keyed=keyed)
                    results.append((r.tokens, r.passes, r.drafted, repr(r.time)))
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
