# Ran at commit dcbb217 (2026-12-04); kept as a record, not maintained: modules may have moved since.
"""Record each step's (context, prompt length, k, shadow) of suffix+auto on the first 12 prompts of
argv[1], --weights quant-i8, over $STORE, for replay_lookup.py.
`STORE=i8store.npz python record_steps.py chat` writes steps_chat.pkl (issue 20)."""
import sys, pickle
from verispec import Engine, SamplingParams
from verispec.bench.workloads import load_workload
from verispec.spec_text import parse_token
from verispec.proposers.suffix_store import SuffixStore
import verispec.drafting as DR
log = []
orig = DR.Drafter.draft
def draft(self, seq, plan):
    log.append((list(seq.tokens), seq.num_prompt, plan.k, plan.shadow))
    return orig(self, seq, plan)
DR.Drafter.draft = draft
e = Engine("default", weights="quant-i8")
import os
base = SuffixStore(); base.load(os.environ["STORE"])
spec = parse_token("suffix+auto", {"k": 8})
e.suffix_store = base.copy()
reqs = []
for p in load_workload(sys.argv[1], limit=12):
    log = []
    e.generate(e.encode_messages(list(p.messages)), SamplingParams(max_new_tokens=128), spec)
    reqs.append(log)
pickle.dump(reqs, open(f"steps_{sys.argv[1]}.pkl", "wb"))
print(sum(len(r) for r in reqs))
