"""What the logit processors cost: speculative decoding with penalties on
against off, on the same prompts, interleaved run by run (medians), and the
processor's own time on a verified block.

    python scripts/penalty_cost.py [--workload code-edit] [--prompts 3] [--tokens 96]

Greedy, n-gram proposer with adaptive k (the default speculation). The
penalties are mild (presence 0.3, frequency 0.3, repetition 1.1, three
logit_bias entries) so the output stays comparable; both runs report tau,
since penalties change what is generated and therefore what n-gram lookup finds.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from verispec import Engine, SamplingParams
from verispec.bench.workloads import load_workload
from verispec.config import DEFAULT_SPEC
from verispec.processors import LogitProcessor, chain_ancestry

PENALTIES = dict(presence_penalty=0.3, frequency_penalty=0.3, repetition_penalty=1.1,
                 logit_bias={13: 1.0, 28: -1.0, 30: 0.5})


def processor_ms(vocab: int, context: int, k: int, repeats: int = 200) -> float:
    """Median ms of LogitProcessor.process on a [k + 1, vocab] verified block."""
    proc = LogitProcessor(SamplingParams(**PENALTIES), vocab, frozenset())
    committed = torch.randint(0, vocab, (context,)).tolist()
    logits = torch.randn(k + 1, vocab)
    drafts = torch.randint(0, vocab, (k,))
    ancestry = chain_ancestry(k)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        proc.process(logits, committed, context // 2, drafts, ancestry)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="code-edit")
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved repeats per prompt")
    args = parser.parse_args()
    engine = Engine("default")
    prompts = [engine.encode_messages(list(p.messages))
               for p in load_workload(args.workload, limit=args.prompts)]
    modes = {"off": SamplingParams(max_new_tokens=args.tokens),
             "on": SamplingParams(max_new_tokens=args.tokens, **PENALTIES)}
    per_token = {m: [] for m in modes}
    tau = {m: [] for m in modes}
    for _ in range(args.rounds):
        for ids in prompts:
            for mode, sampling in modes.items():
                result = engine.generate(ids, sampling, DEFAULT_SPEC)
                per_token[mode].append(result.stats.time_total / result.stats.generated)
                tau[mode].append(result.stats.tau)
    off, on = (statistics.median(per_token[m]) * 1e3 for m in ("off", "on"))
    print(f"model {engine.target.name}, workload {args.workload}, {len(prompts)} prompts x "
          f"{args.rounds} rounds, {args.tokens} tokens, greedy, {DEFAULT_SPEC.proposer} adaptive")
    print(f"ms/token  off {off:.2f}  on {on:.2f}  on/off {on / off:.3f}")
    print(f"tau       off {statistics.median(tau['off']):.2f}  on {statistics.median(tau['on']):.2f}")
    for k in (0, 4, 8):
        print(f"processor on a [{k + 1}, {engine.target.vocab_size}] block after 1000 tokens: "
              f"{processor_ms(engine.target.vocab_size, 1000, k):.3f} ms")


if __name__ == "__main__":
    main()
