# Ran at commit 4cb7938 (2026-12-04); kept as a record, not maintained: modules may have moved since.
"""Issue 20: what adaptive k chooses for `lookahead+auto` step by step, on the first 2 chat
prompts (default model, 96 new tokens). Each step prints k (P: a scheduled probe), the
controller's predicted rate of a k = 1 step over a plain one, and its alpha at depth 1.

    OMP_NUM_THREADS=1 python docs/notebook/draft_shape/choices.py [token] [workload]
"""
import collections
import dataclasses
import sys

from verispec import Engine, SamplingParams
from verispec import plan as planmod
from verispec.bench.workloads import load_workload
from verispec.spec_text import parse_token

log = []
planned = planmod.AdaptiveKPolicy.plan


def plan(self, ctx, room):
    chosen = planned(self, ctx, room)
    controller = self.controller
    seconds = controller.step_seconds(1)
    ratio = (1 + controller.alphas[0]) / seconds[1] * seconds[0]
    log.append((chosen.k, controller._probing, ratio, controller.alphas[0]))
    return chosen


planmod.AdaptiveKPolicy.plan = plan
token = sys.argv[1] if len(sys.argv) > 1 else "lookahead+auto"
workload = sys.argv[2] if len(sys.argv) > 2 else "chat"
engine = Engine("default")
spec = dataclasses.replace(parse_token(token), k=8)
for prompt in load_workload(workload, 2):
    ids = engine.encode_messages(list(prompt.messages))
    out = engine.generate(ids, SamplingParams(max_new_tokens=96), spec)
    print(f"{prompt.id}: tau {out.stats.tau:.2f}, k chosen:",
          dict(collections.Counter(k for k, *_ in log)))
    print(" ".join(f"{k}{'P' if probe else ''}({ratio:.2f},{alpha:.2f})"
                   for k, probe, ratio, alpha in log))
    log.clear()
