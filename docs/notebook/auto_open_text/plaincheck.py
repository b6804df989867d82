# Ran at commit a9b2288 (2026-12-02); kept as a record, not maintained: modules may have moved since.
"""Plain decoding per token, greedy against sampled (T 0.7, top_p 0.9), 64 tokens with ignore_eos, the first 3 chat and creative prompts, 3 interleaved rounds. `OMP_NUM_THREADS=1 python plaincheck.py`."""
import time, statistics
from verispec import Engine, SamplingParams, SpecConfig
from verispec.bench.workloads import load_workload
e = Engine("default")
ps = [e.encode_messages(list(p.messages)) for w in ("chat", "creative") for p in load_workload(w, limit=3)]
res = {"greedy": [], "sampled": []}
for rep in range(3):
    for ids in ps:
        for mode in ("greedy", "sampled"):
            sp = (SamplingParams(max_new_tokens=64, ignore_eos=True) if mode == "greedy" else
                  SamplingParams(max_new_tokens=64, temperature=0.7, top_p=0.9, seed=rep, ignore_eos=True))
            out = e.generate(ids, sp, SpecConfig("none", k=0))
            s = out.stats
            res[mode].append((s.time_total - s.time_prefill) / s.generated * 1000)
for m, v in res.items():
    print(m, f"median {statistics.median(v):.2f} ms/token over {len(v)}")
