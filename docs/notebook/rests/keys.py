# Ran at commit 143d13e (2026-12-04); kept as a record, not maintained: modules may have moved since.
"""Per (proposer, k) of the steps a spec took: count, forward and wall medians, wall relative
to a plain step of the same run, tokens and nodes per step, on the first 6 prompts of $W
(chat), default weights, 96 new tokens; then the run's tokens per second over plain steps'.
`OMP_NUM_THREADS=1 python keys.py lookahead+auto,ngram+auto` (issue 20, rests.md)."""
import os, sys, time, statistics, collections
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "auto_open_text"))
import steptime
from verispec import Engine, SamplingParams
from verispec.bench.workloads import load_workload
from verispec.spec_text import parse_token
steptime.install()
import verispec.request as R
orig = steptime.run_alone
toks = collections.defaultdict(list)
def wrapped(target, request):
    for rec in orig(target, request):
        toks[(rec.record.proposer, rec.record.k)].append((len(rec.tokens), rec.record.drafted))
        yield rec
R.run_alone = wrapped
import verispec.api as api
if hasattr(api, "run_alone"): api.run_alone = wrapped
e = Engine("default")
W = os.environ.get("W", "chat")
prompts = [e.encode_messages(list(p.messages)) for p in load_workload(W, limit=6)]
for s in sys.argv[1].split(","):
    spec = parse_token(s, {"k": 8})
    for t in (steptime.walls, steptime.fwd, toks): t.clear()
    for p in prompts: e.generate(p, SamplingParams(max_new_tokens=96), spec)
    m = statistics.median
    base = m(steptime.walls[("none", 0)])
    tw = 0; tt = 0
    for key in sorted(steptime.walls):
        w = steptime.walls[key]; t = toks[key]
        tw += sum(w); tt += sum(x[0] for x in t)
        print(s, key, len(w), f"fwd {m(steptime.fwd[key])*1e3:.2f} wall med {m(w)*1e3:.2f} rel {m(w)/base:.3f} tokens/step {sum(x[0] for x in t)/len(t):.2f} nodes {sum(x[1] for x in t)/len(t):.1f} eff {(sum(x[0] for x in t)/len(t))/(m(w)/base):.3f}")
    print(s, "total tokens/s rel", tt / tw * base)
