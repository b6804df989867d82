# Ran at commit b5ae18d (2026-12-02); kept as a record, not maintained: modules may have moved since.
"""In-situ time of the policy pieces (perf_counter wrappers, per committed step) for one spec on the first 3 creative and chat prompts. `python insitu.py ngram+auto`."""
import sys, time, collections, functools
import verispec.plan as P, verispec.policy as Po, verispec.economics as E, verispec.acceptance as A, verispec.engine as En, verispec.request as R
acc = collections.Counter(); cnt = collections.Counter()
def wrap(obj, name, label):
    f = getattr(obj, name)
    @functools.wraps(f)
    def g(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); acc[label] += time.perf_counter() - t; cnt[label] += 1; return r
    setattr(obj, name, g)
wrap(P.PlanContext, "evidence", "plan.evidence")
wrap(Po.AdaptiveK, "choose", "choose")
wrap(Po.AdaptiveK, "best", "choose.best")
wrap(Po.AdaptiveK, "step_seconds", "choose.best.step_seconds")
wrap(E, "best_draft", "best_draft"); Po.best_draft = E.best_draft
wrap(Po.AdaptiveK, "observe", "observe")
wrap(Po.AdaptiveK, "_time", "observe._time")
wrap(Po.AdaptiveK, "_accept", "observe._accept")
wrap(Po.AdaptiveK, "observe_shadow", "observe_shadow")
wrap(E.StepCost, "observe", "curve.observe")
wrap(E.StepCost, "table", "curve.table")
wrap(R.SpecRequest, "context", "request.context")
wrap(R, "outcome", "outcome")
wrap(R.SpecRequest, "record", "record")
import verispec.proposers.auto as Au, verispec.drafting as D
wrap(P.AutoPolicy, "plan", "auto.plan")
wrap(P.AutoPolicy, "pick", "auto.plan.pick")
wrap(P.AutoPolicy, "observe", "auto.observe")
wrap(Au.AutoProposer, "alphas", "auto.alphas")
wrap(Au.AutoProposer, "_score", "auto._score")
wrap(Au.AutoProposer, "_evidence_for", "auto._evidence_for")
wrap(Au.AutoProposer, "propose", "auto.propose")
wrap(Au.AutoProposer, "verified", "auto.verified")
wrap(D.Drafter, "draft", "drafter.draft")
wrap(En, "commit", "commit"); R.commit = En.commit
import verispec.proposers.eagle as Ea, verispec.proposers.medusa as Me, verispec.proposers.lookahead as Lo, verispec.proposers.suffix as Su, verispec.proposers.ngram as Ng
for mod, cls in ((Ea, "EagleProposer"), (Me, "MedusaProposer"), (Lo, "LookaheadProposer"), (Su, "SuffixProposer"), (Ng, "NgramProposer")):
    if hasattr(mod, cls):
        wrap(getattr(mod, cls), "propose", cls + ".propose")
        if hasattr(getattr(mod, cls), "evidence"): wrap(getattr(mod, cls), "evidence", cls + ".evidence")
from verispec import Engine, SamplingParams
from verispec.bench.workloads import load_workload
from verispec.spec_text import parse_token
e = Engine("default")
spec = parse_token(sys.argv[1], {"k": 8})
steps = 0
for w in ("creative", "chat"):
    for p in load_workload(w, limit=3):
        out = e.generate(e.encode_messages(list(p.messages)), SamplingParams(max_new_tokens=64), spec)
        steps += len(out.stats.steps)
for k in sorted(acc, key=lambda k: -acc[k]):
    print(f"{k:28s} {acc[k] / steps * 1e6:7.1f} us/step  ({cnt[k]} calls)")
