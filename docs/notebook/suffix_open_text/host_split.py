# Ran at commit 143d13e (2026-12-04); kept as a record, not maintained: modules may have moved since.
"""Per-step host microseconds (means, and medians) of each spec, one process, `REPS` rounds (2):
the plan, draft, feed, commit, after, observe and record parts of the run_alone loop (timed by
auto_open_text/steptime.py), on the first $N (12) prompts of $W (chat), $NEW (128) new tokens,
--weights $WEIGHTS (quant-i8), a fresh copy of the store in $STORE (if set) per spec and round.
`OMP_NUM_THREADS=1 STORE=i8store.npz python host_split.py none,suffix+auto` (issue 20);
`OMP_NUM_THREADS=1 WEIGHTS=auto N=6 NEW=96 python host_split.py none,lookahead+auto` (rests.md)."""
import os, statistics, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "auto_open_text"))
import steptime
from verispec import Engine, SamplingParams
from verispec.bench.workloads import load_workload
from verispec.spec_text import parse_token
from verispec.proposers.suffix_store import SuffixStore

NAMES = ("plan", "draft", "commit", "after", "observe", "record", "feed")
steptime.install()
e = Engine("default", weights=os.environ.get("WEIGHTS", "quant-i8"))
base = SuffixStore()
if os.environ.get("STORE"):
    base.load(os.environ["STORE"])
prompts = [e.encode_messages(list(p.messages))
           for p in load_workload(os.environ.get("W", "chat"), limit=int(os.environ.get("N", "12")))]
for rep in range(int(os.environ.get("REPS", "2"))):
    for s in sys.argv[1].split(","):
        spec = parse_token(s, {"k": 8})
        e.suffix_store = base.copy()
        for table in (steptime.parts, steptime.walls, steptime.fwd, steptime.drafts):
            table.clear()
        t = time.perf_counter()
        for p in prompts:
            e.generate(p, SamplingParams(max_new_tokens=int(os.environ.get("NEW", "128"))), spec)
        total = time.perf_counter() - t
        rows = [row for key in steptime.parts for row in steptime.parts[key]]
        walls = [w for key in steptime.walls for w in steptime.walls[key]]
        fwd = [f for key in steptime.fwd for f in steptime.fwd[key]]
        mean = lambda xs: sum(xs) / len(xs)
        host = {name: round(mean([row[i] for row in rows]) * 1e6) for i, name in enumerate(NAMES)}
        print(s, f"total {total:.2f}s steps {len(walls)} wall mean ms {mean(walls) * 1e3:.3f} "
              f"fwd mean ms {mean(fwd) * 1e3:.3f}")
        print("  host mean us:", host, "total", sum(host.values()), flush=True)
        med = {name: round(statistics.median([row[i] for row in rows]) * 1e6)
               for i, name in enumerate(NAMES)}
        print("  host median us:", med, "total", sum(med.values()), flush=True)
