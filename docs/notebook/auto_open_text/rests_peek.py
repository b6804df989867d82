# Ran at commit 37dd433 (2026-12-04); kept as a record, not maintained: modules may have moved since.
"""Which of `auto`'s costly candidates rest after each request of one Engine (the debug log of
auto_memory) on the first 12 prompts of a workload, --weights quant-i8.
`OMP_NUM_THREADS=1 python rests_peek.py chat` (issue 20)."""
import logging, sys
from verispec import Engine, SamplingParams, SpecConfig
from verispec.bench.workloads import load_workload
logging.basicConfig(level=logging.DEBUG, format="%(message)s")
for n in ("verispec.proposers.auto", "verispec.proposers.auto_memory"):
    logging.getLogger(n).setLevel(logging.DEBUG)
e = Engine("default", weights="quant-i8")
for p in load_workload(sys.argv[1], limit=12):
    r = e.generate(e.encode_messages(list(p.messages)), SamplingParams(max_new_tokens=128), SpecConfig("auto", k=8, adaptive=True))
    print("req", {n: (m.resting, m.rest.interval) for n, m in e.auto_memory.candidates.items() if m.resting or m.rest.interval > 1})
