# Ran at commit 37dd433 (2026-12-04); kept as a record, not maintained: modules may have moved since.
"""`auto` with its full candidate list against restricted lists (auto.CANDIDATES patched), plain
decoding and suffix+auto, in one process, in alternating order for REPS rounds (wall and cpu
medians), the first 12 prompts of $W (chat), 128 new tokens, --weights quant-i8, a cold store
and a fresh `Engine.auto_memory` per run; every output is checked against plain decoding.
`OMP_NUM_THREADS=1 REPS=4 python candidate_sets.py` (issue 20: the costly candidates' rests)."""
import os, sys, time, statistics
from verispec import Engine, SamplingParams
from verispec.bench.workloads import load_workload
from verispec.spec_text import parse_token
from verispec.proposers.suffix_store import SuffixStore
import verispec.proposers.auto as A
FULL = A.CANDIDATES
e = Engine("default", weights="quant-i8")
W = os.environ.get("W", "chat")
prompts = [e.encode_messages(list(p.messages)) for p in load_workload(W, limit=12)]
configs = [("none", "none", FULL), ("auto", "auto", FULL),
           ("auto-free", "auto", ("ngram", "suffix", "lookahead")),
           ("auto-s", "auto", ("suffix",)), ("auto-ns", "auto", ("ngram", "suffix")),
           ("suffix+auto", "suffix+auto", FULL)]
sp = SamplingParams(max_new_tokens=128)
ref = {}
times = {c[0]: [] for c in configs}
cpu = {c[0]: [] for c in configs}
for rep in range(int(os.environ.get("REPS", "2"))):
    for label, tok, cands in (configs if rep % 2 == 0 else configs[::-1]):
        A.CANDIDATES = cands
        e.suffix_store = SuffixStore()
        from verispec.proposers.auto_memory import AutoMemory; e.auto_memory = AutoMemory()
        spec = parse_token(tok, {"k": 8})
        t = time.perf_counter(); c0 = time.process_time(); outs = []
        for p in prompts:
            outs.append(e.generate(p, sp, spec).token_ids)
        times[label].append(time.perf_counter() - t); cpu[label].append(time.process_time() - c0)
        if label == "none": ref = outs
        elif ref: assert outs == ref, label
base = statistics.median(times["none"]); cbase = statistics.median(cpu["none"])
for label, ts in times.items():
    print(f"{label:12s} median {statistics.median(ts):.2f}s  speedup {base / statistics.median(ts):.3f}  {['%.2f' % x for x in ts]}  cpu speedup {cbase / statistics.median(cpu[label]):.3f}")
