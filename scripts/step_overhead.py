"""The host cost of the step loop, in CPU seconds per committed token, on a tiny random
model (hidden size 64), where the Python around the forward is most of a step: a
refactor of the engine that costs host time shows here first. CPU time of this process
on one thread, not wall time, so that neighbours on a shared machine weigh less.

    python scripts/step_overhead.py CHECKOUT [REPEATS]

prints one JSON object: per setting, the CPU seconds per token of each repeat.
"""
from __future__ import annotations

import json
import sys
import time


def main() -> int:
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    sys.path.insert(0, root)
    sys.path.insert(0, f"{root}/tests")
    import torch

    torch.set_num_threads(1)
    from conftest import tiny_engine
    from verispec.config import SamplingParams, SpecConfig

    engine = tiny_engine()
    prompt = [3, 17, 4, 9, 3, 17, 4, 9, 3, 17, 4, 22, 5, 3, 17] * 3
    sampling = SamplingParams(max_new_tokens=96)
    settings = {"none": SpecConfig("none", k=0), "ngram k=4": SpecConfig("ngram", k=4),
                "ngram adaptive": SpecConfig("ngram", k=8, adaptive=True),
                "ngram tree=16": SpecConfig("ngram", k=8, adaptive=True, tree=16)}
    for spec in settings.values():
        engine.generate(prompt, sampling, spec)  # warm-up
    found: dict[str, list[float]] = {name: [] for name in settings}
    for _ in range(repeats):
        for name, spec in settings.items():
            t0 = time.process_time()
            out = engine.generate(prompt, sampling, spec)
            found[name].append((time.process_time() - t0) / len(out.token_ids))
    print(json.dumps(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
