# Ran at commit 4e12389 (2026-12-03); kept as a record, not maintained: modules may have moved since.
"""In-situ time of the adaptive-k policy's methods per step (perf_counter wrappers).

    OMP_NUM_THREADS=1 python docs/notebook/suffix_open_text/insitu_policy.py chat ngram
"""
import time, sys, collections
from verispec import Engine, SamplingParams, SpecConfig
from verispec.bench.workloads import load_workload
import verispec.plan as P, verispec.policy as PO, verispec.acceptance as A, verispec.economics as E, verispec.proposers.ngram as NG
acc = collections.defaultdict(float); cnt = collections.Counter()
def timed(name, fn):
    def w(*a, **k):
        t = time.perf_counter(); r = fn(*a, **k); acc[name] += time.perf_counter() - t; cnt[name] += 1; return r
    return w
eng = Engine("default")
sp = SamplingParams(max_new_tokens=128)
prompts = [eng.encode_messages(list(p.messages)) for p in load_workload(sys.argv[1], 4)]
spec = SpecConfig(sys.argv[2], k=8, adaptive=True)
eng.generate(prompts[0], sp, spec)
targets = [(P.AdaptiveKPolicy, "plan"), (P.Policy, "observe"), (P.PlanContext, "evidence"), (PO.AdaptiveK, "choose"),
  (PO.AdaptiveK, "begin_step"), (PO.AdaptiveK, "best"), (PO.AdaptiveK, "step_seconds"), (PO.AdaptiveK, "observe"),
  (PO.AdaptiveK, "observe_shadow"), (PO.AdaptiveK, "_time"), (PO.AdaptiveK, "_accept"), (A.DepthAcceptance, "add"),
  (E.StepCost, "observe"), (E.DraftPrice, "observe"), (PO, "best_draft"), (P.AdaptiveKPolicy, "_learn")]
for obj, attr in targets:
    setattr(obj, attr, timed(attr, getattr(obj, attr)))
import verispec.policy
steps = 0
for p in prompts:
    steps += eng.generate(p, sp, spec).stats.target_forwards
for k in acc: print(f"{k:15s} calls/step {cnt[k]/steps:.2f} us/step {1e6*acc[k]/steps:.1f}")
