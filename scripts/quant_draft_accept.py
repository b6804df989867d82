"""Acceptance, tau and speed of quantized self-drafts on the default model, against
plain decoding on the same engine (each prompt: plain, then the draft; outputs
asserted identical).

  python scripts/quant_draft_accept.py quant,dense quant:Q4_0,quant:Q8_0,quant:Q4_0:15
"""
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's verispec

from verispec import Engine, SamplingParams, SpecConfig  # noqa: E402

PROMPTS = ["Write a short poem about the sea.", "Explain what a hash table is, briefly.",
           "List five fruits and one fact about each.", "Summarize: The cat sat on the mat. It was warm. The dog watched."]
for weights in sys.argv[1].split(","):
    eng = Engine("default", dtype="bf16", weights=weights)
    for draft in sys.argv[2].split(","):
        t0 = time.perf_counter(); eng.load_draft(draft); load = time.perf_counter() - t0
        acc = dr = gen = fw = 0; ratios = []
        for p in PROMPTS:
            ids = eng.encode(p, chat=True)
            s = SamplingParams(max_new_tokens=64)
            a = eng.generate(ids, s, SpecConfig("none", k=0))
            b = eng.generate(ids, s, SpecConfig("draft", k=4, draft=draft))
            assert a.token_ids == b.token_ids
            acc += b.stats.accepted; dr += b.stats.drafted; gen += b.stats.generated; fw += b.stats.target_forwards
            ratios.append(a.stats.time_total / b.stats.time_total)
        print(f"target weights={weights} draft={draft} (built in {load:.1f}s): acceptance {acc/dr:.2f}, tau {gen/fw:.2f}, "
              f"speedup vs plain median {statistics.median(ratios):.2f}x (per prompt {', '.join(f'{r:.2f}' for r in ratios)}), outputs identical")
