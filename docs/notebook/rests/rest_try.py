# Ran at commit 143d13e (2026-12-04); kept as a record, not maintained: modules may have moved since.
"""Each request of a session on one Engine (6 prompts of a workload, twice), a spec against
plain decoding: whether the spec's proposer rested, its tau, plain time over its time; the
rests logged as they start. Asserts equal outputs.
`OMP_NUM_THREADS=1 python rest_try.py lookahead+auto [chat]` (issue 20, rests.md)."""
import sys, time, logging
from verispec import Engine, SamplingParams
from verispec.bench.workloads import load_workload
from verispec.spec_text import parse_token
logging.basicConfig(level=logging.DEBUG, format="%(message)s")
for n in ("urllib3", "filelock", "httpx"): logging.getLogger(n).setLevel(logging.WARNING)
e = Engine("default")
prompts = [e.encode_messages(list(p.messages)) for p in load_workload(sys.argv[2] if len(sys.argv) > 2 else "chat", limit=6)]
spec = parse_token(sys.argv[1], {"k": 8})
plain = parse_token("none", {"k": 8})
for p in prompts * 2:
    a = e.generate(p, SamplingParams(max_new_tokens=96), spec)
    b = e.generate(p, SamplingParams(max_new_tokens=96), plain)
    assert a.token_ids == b.token_ids
    print(f"rested={a.stats.rested} tau={a.stats.tau:.2f} ratio={b.stats.time_total / a.stats.time_total:.3f}", flush=True)
