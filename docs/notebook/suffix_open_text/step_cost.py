# Ran at commit 4e12389 (2026-12-03); kept as a record, not maintained: modules may have moved since.
"""Per-pass time split of plain, suffix (k 1, warm store) and ngram (k 1) on 4 chat prompts.

    OMP_NUM_THREADS=1 python docs/notebook/suffix_open_text/step_cost.py store.npz
"""
import sys
import statistics
from verispec import Engine, SamplingParams, SpecConfig
from verispec.bench.workloads import load_workload
eng = Engine("default")
eng.suffix_store.load(sys.argv[1], eng.target.vocab_size)
base = eng.suffix_store
sp = SamplingParams(max_new_tokens=128)
prompts = [eng.encode_messages(list(p.messages)) for p in load_workload("chat", 4)]
cfgs = {"none": SpecConfig("none"), "sfx k1": SpecConfig("suffix", k=1), "ngram k1": SpecConfig("ngram", k=1), "sfx auto": SpecConfig("suffix", k=8, adaptive=True)}
eng.generate(prompts[0], sp, cfgs["none"])
res = {n: [] for n in cfgs}
for rep in range(3):
    for p in prompts:
        for n, c in cfgs.items():
            eng.suffix_store = base.copy()
            s = eng.generate(p, sp, c).stats
            dec = s.time_total - s.time_prefill
            res[n].append((dec / s.target_forwards, s.time_draft / s.target_forwards, s.time_verify / s.target_forwards, s.generated / s.target_forwards, sum(st.drafted for st in s.steps) / s.target_forwards))
for n, rows in res.items():
    med = lambda i: statistics.median(r[i] for r in rows)
    print(f"{n:9s} ms/pass {1e3*med(0):.3f} draft {1e3*med(1):.3f} verify {1e3*med(2):.3f} other {1e3*(med(0)-med(1)-med(2)):.3f} tau {med(3):.2f} drafted/pass {med(4):.2f} ms/token {1e3*med(0)/med(3):.3f}")
