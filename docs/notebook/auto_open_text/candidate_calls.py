# Ran at commit 0df871a (2026-12-03); kept as a record, not maintained: modules may have moved since.
"""Per `auto` candidate: calls per step, milliseconds per call, share of the run's time, and
how often it drafted, over the first 12 prompts of a workload (128 new tokens, greedy, one
request at a time on the default model).

    OMP_NUM_THREADS=1 python docs/notebook/auto_open_text/candidate_calls.py chat
"""
import collections
import sys
import time

from verispec import Engine, SamplingParams, SpecConfig
from verispec.bench.workloads import load_workload
import verispec.proposers.auto as auto_module

engine = Engine("default")
sampling = SamplingParams(max_new_tokens=128)
prompts = [engine.encode_messages(list(p.messages)) for p in load_workload(sys.argv[1], 12)]
spec = SpecConfig("auto", k=8, adaptive=True)
engine.generate(prompts[0], sampling, spec)  # warm-up

seconds = collections.defaultdict(float)
calls = collections.Counter()
chosen = collections.Counter()
original = auto_module.AutoProposer.propose


def timed(name, propose):
    def wrapper(ctx, k):
        start = time.perf_counter()
        proposal = propose(ctx, k)
        seconds[name] += time.perf_counter() - start
        calls[name] += 1
        return proposal
    return wrapper


def propose(self, ctx, k):
    for name, track in self.tracks.items():
        if not getattr(track.proposer, "_timed", False):
            track.proposer.propose = timed(name, track.proposer.propose)
            track.proposer._timed = True
    proposal = original(self, ctx, k)
    chosen[self.choice] += 1
    return proposal


auto_module.AutoProposer.propose = propose
steps, total = 0, 0.0
for ids in prompts:
    start = time.perf_counter()
    stats = engine.generate(ids, sampling, spec).stats
    total += time.perf_counter() - start
    steps += stats.target_forwards
print(f"steps {steps}, ms per step {1e3 * total / steps:.2f}")
for name in seconds:
    print(f"{name:10s} calls/step {calls[name] / steps:.3f}  ms/call "
          f"{1e3 * seconds[name] / max(calls[name], 1):.3f}  share {100 * seconds[name] / total:.2f}%  "
          f"drafted on {chosen[name]} steps")
print(dict(chosen))
