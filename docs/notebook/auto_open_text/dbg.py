# Ran at commit b5ae18d (2026-12-02); kept as a record, not maintained: modules may have moved since.
"""How often auto chose or probed each candidate on open text, and how often the probe intervals were reset. `python dbg.py`."""
import collections
from verispec import Engine, SamplingParams
from verispec.bench.workloads import load_workload
from verispec.spec_text import parse_token
from verispec.proposers.suffix_store import SuffixStore
import verispec.proposers.auto as A
import verispec.cadence as C
e = Engine("default")
spec = parse_token("auto", {"k": 8})
resets = collections.Counter()
orig_reset = C.Backoff.reset
def reset(self): resets["reset"] += 1; orig_reset(self)
C.Backoff.reset = reset
calls = collections.Counter()
orig_prop = A.AutoProposer.propose
def prop(self, ctx, k):
    r = orig_prop(self, ctx, k)
    for name, t in self.tracks.items():
        if t.pending or name == self.choice: calls[(name, "chosen" if name == self.choice else "called")] += 1
    return r
A.AutoProposer.propose = prop
for w in ("creative", "chat"):
    for p in load_workload(w, limit=3):
        e.suffix_store = SuffixStore()
        out = e.generate(e.encode_messages(list(p.messages)), SamplingParams(max_new_tokens=64), spec)
        print(p.id, len(out.stats.steps), collections.Counter(s.proposer for s in out.stats.steps))
print(resets, sorted(calls.items()))
