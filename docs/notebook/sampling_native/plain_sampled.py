"""Plain decoding per token on the default model, greedy against sampled (T 0.7, top_p 0.9,
and T 0.7, top_k 40, top_p 0.95), 64 tokens with ignore_eos, the first 3 chat and creative
prompts (or WORKLOADS'), ROUNDS interleaved rounds; prints each mode's median ms per decoded
token. `OMP_NUM_THREADS=1 python plain_sampled.py [ROUNDS] [WORKLOADS]`, WORKLOADS a comma
list; PYTHONPATH picks the checkout."""
import statistics
import sys

from verispec import Engine, SamplingParams, SpecConfig
from verispec.bench.workloads import load_workload

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
workloads = sys.argv[2].split(",") if len(sys.argv) > 2 else ["chat", "creative"]
engine = Engine("default")
prompts = [engine.encode_messages(list(p.messages)) for w in workloads for p in load_workload(w, limit=3)]
modes = {
    "greedy": {},
    "T0.7 top_p 0.9": {"temperature": 0.7, "top_p": 0.9},
    "T0.7 top_k 40 top_p 0.95": {"temperature": 0.7, "top_k": 40, "top_p": 0.95},
}
times = {mode: [] for mode in modes}
for rep in range(rounds):
    for ids in prompts:
        for mode, extra in modes.items():
            params = SamplingParams(max_new_tokens=64, ignore_eos=True, seed=rep, **extra)
            stats = engine.generate(ids, params, SpecConfig("none", k=0)).stats
            times[mode].append((stats.time_total - stats.time_prefill) / stats.generated * 1000)
for mode, values in times.items():
    print(f"{mode}: median {statistics.median(values):.2f} ms/token over {len(values)}")
