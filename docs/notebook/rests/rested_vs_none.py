# Ran at commit 143d13e (2026-12-04); kept as a record, not maintained: modules may have moved since.
"""A rested request against plain decoding: the first 6 prompts of a workload (agentic), 96 new
tokens, none / lookahead+auto / eagle+auto interleaved 3 times, the two costly proposers made to
rest before every request; per-prompt ratio of median wall times, prefill and request build.
`OMP_NUM_THREADS=1 python rested_vs_none.py agentic` (issue 20, rests.md)."""
import sys, time, statistics, collections
from verispec import Engine, SamplingParams
from verispec.bench.workloads import load_workload
from verispec.spec_text import parse_token
e = Engine("default")
W = sys.argv[1] if len(sys.argv) > 1 else "agentic"
prompts = [e.encode_messages(list(p.messages)) for p in load_workload(W, limit=6)]
specs = {t: parse_token(t, {"k": 8}) for t in ["none", "lookahead+auto", "eagle+auto"]}
for key in ("lookahead/tree", "eagle"):
    for _ in range(8): e.rests.judge(key, -1.0)
T = collections.defaultdict(list); P = collections.defaultdict(list); B = collections.defaultdict(list)
import verispec.api as api
for rep in range(3):
    for i, p in enumerate(prompts):
        order = list(specs)[(i + rep) % 3:] + list(specs)[:(i + rep) % 3]
        for t in order:
            for key in ("lookahead/tree", "eagle"): e.rests.candidates[key].resting = 2
            t0 = time.perf_counter(); r = e.new_request(p, SamplingParams(max_new_tokens=96), specs[t]); B[t].append(time.perf_counter() - t0)
            t0 = time.perf_counter(); res = e.generate(p, SamplingParams(max_new_tokens=96), specs[t]); T[(t, i)].append(time.perf_counter() - t0)
            P[t].append(res.stats.time_prefill)
            assert t == "none" or res.stats.rested
m = statistics.median
for t in specs:
    ratios = [m(T[("none", i)]) / m(T[(t, i)]) for i in range(len(prompts))]
    print(t, "ratio vs none per prompt", [round(x, 3) for x in ratios], "median", round(m(ratios), 3),
          "prefill med ms", round(m(P[t]) * 1e3, 1), "build med ms", round(m(B[t]) * 1e3, 2))
