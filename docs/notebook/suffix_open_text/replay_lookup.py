# Ran at commit dcbb217 (2026-12-04); kept as a record, not maintained: modules may have moved since.
"""Replay recorded steps (record_steps.py) through a SuffixProposer over a copy of $STORE: the
evidence and draft lookups' microseconds a step, and every step's (evidence key, draft) pickled
to argv[2] to compare two versions. THRASH_MB=150 streams that many MB between steps, as a
target pass does, so the lookup runs with cold caches.
`THRASH_MB=150 STORE=i8store.npz python replay_lookup.py steps_chat.pkl drafts.pkl` (issue 20)."""
import sys, pickle, time, statistics, os
import numpy as np
big = np.ones(int(os.environ.get('THRASH_MB', '0')) * 131072) if os.environ.get('THRASH_MB') else None
from verispec.proposers.suffix import SuffixProposer
from verispec.proposers.suffix_store import SuffixStore
from verispec.proposers.base import DraftContext
reqs = pickle.load(open(sys.argv[1], "rb"))
base = SuffixStore()
base.load(os.environ["STORE"])
times = []; out = []
for rep in range(3):
    store = base.copy(); drafts = []; t_all = 0.0
    for steps in reqs:
        prop = SuffixProposer(store, frozenset({2}), max_k=8)
        for tokens, num_prompt, k, shadow in steps:
            ctx = DraftContext(tokens, num_prompt, (), tree_nodes=0)
            if big is not None: big.sum()
            t = time.perf_counter()
            ev = prop.evidence(ctx)
            p = prop.propose(ctx, k if k else 1)
            t_all += time.perf_counter() - t
            drafts.append((ev.key, p.tokens.tolist() if len(p) else []))
        prop.finished(DraftContext(steps[-1][0], steps[-1][1]))
    times.append(t_all / sum(len(s) for s in reqs) * 1e6); out = drafts
print("us/step per rep:", [round(t, 1) for t in times])
pickle.dump(out, open(sys.argv[2], "wb"))
