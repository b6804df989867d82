# Ran at commit dcbb217 (2026-12-04); kept as a record, not maintained: modules may have moved since.
"""Per-step wall time by (candidate, k) and the host-side parts of a step (plan, draft, commit, after, observe, record), for one spec on the first 3 prompts of the given workloads. `python steptime.py auto creative,chat` (issue 20, auto on open text)."""
import sys, time, collections, statistics
from verispec import Engine, SamplingParams
from verispec.bench.workloads import load_workload
from verispec.spec_text import parse_token
from verispec.proposers.suffix_store import SuffixStore
import verispec.request as R
from verispec.request import forward, outcome
from verispec.engine import commit, feed
parts = collections.defaultdict(list); walls = collections.defaultdict(list); fwd = collections.defaultdict(list); drafts = collections.defaultdict(list)
def run_alone(target, request):
    seq, drafter, policy = request.seq, request.drafter, request.policy
    if not seq.prefilled:
        request.complete(forward(target, request.prepare()))
    while not seq.finished:
        t_start = time.perf_counter()
        plan = policy.plan(request.context(), request.room())
        t_plan = time.perf_counter()
        drafted = drafter.draft(seq, plan)
        t_draft = time.perf_counter()
        fed = feed(seq, drafted.draft)
        t0 = time.perf_counter()
        out = forward(target, fed)
        t1 = time.perf_counter()
        committed = commit(seq, drafted.draft, out, t1 - t0, rows=drafter.proposer.reads_rows)
        t2 = time.perf_counter()
        drafter.after(seq, committed)
        t3 = time.perf_counter()
        policy.observe(plan, outcome(drafted, committed))
        t4 = time.perf_counter()
        rec = request.record(plan, drafted, committed)
        t5 = time.perf_counter()
        w = time.perf_counter() - t_start
        key = (rec.record.proposer, plan.k)
        parts[key].append((t_plan - t_start, t_draft - t_plan, t2 - t1, t3 - t2, t4 - t3, t5 - t4,
                           t0 - t_draft))
        walls[key].append(w); fwd[key].append(t1 - t0); drafts[key].append(drafted.seconds)
        yield rec
def install():
    """Route every request's loop through the timed run_alone above."""
    R.run_alone = run_alone
    import verispec.api as api
    if hasattr(api, "run_alone"): api.run_alone = run_alone


def main():
    install()
    e = Engine("default")
    spec = parse_token(sys.argv[1], {"k": 8})
    for w in sys.argv[2].split(","):
        for p in load_workload(w, limit=3):
            e.suffix_store = SuffixStore()
            e.generate(e.encode_messages(list(p.messages)), SamplingParams(max_new_tokens=64), spec)
    base = statistics.median(walls[("none", 0)]) if walls[("none", 0)] else None
    for key in sorted(walls):
        m = statistics.median
        print("   plan/draft/commit/after/observe/record/feed us:", [round(m(x[i] for x in parts[key]) * 1e6) for i in range(7)])
        print(key, len(walls[key]), f"wall {m(walls[key])*1e3:.2f}ms fwd {m(fwd[key])*1e3:.2f} draft {m(drafts[key])*1e3:.2f} other {(m(walls[key])-m(fwd[key])-m(drafts[key]))*1e3:.2f}", f"rel {m(walls[key])/base:.2f}" if base else "")


if __name__ == "__main__":
    main()
