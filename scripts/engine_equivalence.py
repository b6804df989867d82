"""Does a refactor of the engine change what it does, step by step? Runs a tiny random
model through `Engine.generate` and the serving `Scheduler` under many speculation settings
(fixed k, adaptive k, trees, a draft model, suffix, auto, sampling) with the
clock stopped, so adaptive choices depend on acceptance alone, and prints every committed
token and every step record as JSON. Run it on two checkouts and compare:

    python scripts/engine_equivalence.py OLD_CHECKOUT > before.json
    python scripts/engine_equivalence.py . > after.json
    cmp before.json after.json && echo identical

A stopped clock (every reading 0.0) is what the controllers treat as an untimed step, so
their timing estimates stay at the prior and nothing depends on the machine's load.
"""
from __future__ import annotations

import inspect
import json
import sys
import threading
import time


def main() -> int:
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    sys.path.insert(0, root)
    sys.path.insert(0, f"{root}/tests")
    time.perf_counter = lambda: 0.0  # before verispec is imported: every module sees it
    from conftest import tiny_engine
    from verispec.config import SamplingParams, SpecConfig
    from verispec.serving.scheduler import Progress, Scheduler, SchedulerConfig, Ticket

    engine = tiny_engine()
    prompts = [[3, 17, 4, 9, 3, 17, 4, 9, 3, 17, 4, 22, 5, 3, 17], [1, 2, 3, 4, 5, 1, 2, 3],
               [40, 41, 42, 40, 41, 42, 40, 41, 7, 8, 40, 41, 42]]
    specs = [SpecConfig("ngram", k=4), SpecConfig("ngram", k=8, adaptive=True),
             SpecConfig("ngram", k=8, tree=16),
             SpecConfig("ngram", k=8, adaptive=True, tree=16),
             SpecConfig("draft", k=4, draft="same"),
             SpecConfig("draft", k=6, draft="same", adaptive=True),
             SpecConfig("draft", k=4, draft="same", tree=8),
             SpecConfig("suffix", k=6, adaptive=True), SpecConfig("auto", k=6, adaptive=True),
             SpecConfig("none", k=0)]
    samplings = [SamplingParams(max_new_tokens=48),
                 SamplingParams(max_new_tokens=40, temperature=0.8, seed=3)]

    def steps(stats):
        return [(s.proposer, s.k, s.drafted, s.accepted, s.emitted, s.evidence, s.bonus,
                 list(s.rejected)) for s in stats.steps]

    results = []
    for sampling in samplings:
        for spec in specs:
            for prompt in prompts:
                out = engine.generate(prompt, sampling, spec)
                results.append([out.token_ids, steps(out.stats), out.finish_reason])

    own_timing = "own_timing" in inspect.signature(engine.new_request).parameters
    build = ((lambda *a: engine.new_request(*a, own_timing=False)) if own_timing
             else engine.new_request)
    for streams in (1, 3):
        scheduler = Scheduler(engine.target, build, SchedulerConfig(max_num_seqs=streams,
                                                                    calibrate=False))
        done, found = [], {}
        tickets = []
        for i, (spec, prompt) in enumerate([(s, p) for s in specs for p in prompts[:2]]):
            event = threading.Event()
            done.append(event)
            found[i] = {"tokens": [], "stats": None}

            def sink(e, i=i, event=event):
                if isinstance(e, Progress):
                    found[i]["tokens"].extend(e.tokens)
                    found[i]["stats"] = e.stats
                    if e.finish_reason:
                        event.set()
                else:
                    found[i]["failure"] = e.message
                    event.set()
            tickets.append(Ticket(prompt, samplings[0], spec, sink))
        scheduler.submit(tickets)
        for event in done:
            event.wait(120)
        scheduler.close()
        for i in sorted(found):
            stats = found[i]["stats"]
            results.append([found[i]["tokens"], steps(stats) if stats else found[i].get("failure")])
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
