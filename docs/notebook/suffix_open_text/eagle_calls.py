# Ran at commit 4e12389 (2026-12-03); kept as a record, not maintained: modules may have moved since.
"""Rows caught up, draft length and seconds of every EAGLE call inside `auto` on 4 chat prompts.

    OMP_NUM_THREADS=1 python docs/notebook/suffix_open_text/eagle_calls.py
"""
import time, statistics
from verispec import Engine, SamplingParams, SpecConfig
from verispec.bench.workloads import load_workload
import verispec.proposers.eagle as EA
rec = []
orig = EA.EagleProposer.propose
def w(self, ctx, k):
    rows = sum(h.shape[0] for h in ctx.target_hidden[:1]) if ctx.target_hidden else 0
    t = time.perf_counter(); r = orig(self, ctx, k); rec.append((rows, k, time.perf_counter() - t)); return r
EA.EagleProposer.propose = w
eng = Engine("default")
sp = SamplingParams(max_new_tokens=128)
prompts = [eng.encode_messages(list(p.messages)) for p in load_workload("chat", 4)]
spec = SpecConfig("auto", k=8, adaptive=True)
eng.generate(prompts[0], sp, spec); rec.clear()
for p in prompts: eng.generate(p, sp, spec)
for r in rec: print(r[0], r[1], "%.2f ms" % (1e3 * r[2]))
