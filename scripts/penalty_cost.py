"""What the logit processors cost: speculative decoding with penalties on
against off, on the same prompts, interleaved run by run (medians), and the
processor's own time on a verified block.

    python scripts/penalty_cost.py [--workload code-edit] [--prompts 3] [--tokens 96]

Greedy; speculative (the default: n-gram lookup, adaptive k) and plain, each
with penalties off and on. The penalties are mild (presence 0.3, frequency
0.3, repetition 1.1, three logit_bias entries). Plain on/off isolates the
processors' own cost; speculative on/off adds what penalties do to acceptance:
they discourage repeating the context, which is what n-gram lookup drafts.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from verispec import Engine, SamplingParams, SpecConfig
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
    off = SamplingParams(max_new_tokens=args.tokens)
    on = SamplingParams(max_new_tokens=args.tokens, **PENALTIES)
    plain = SpecConfig("none", k=0)
    modes = {"spec off": (off, DEFAULT_SPEC), "spec on": (on, DEFAULT_SPEC),
             "plain off": (off, plain), "plain on": (on, plain)}
    per_token = {m: [] for m in modes}
    tau = {m: [] for m in modes}
    for _ in range(args.rounds):
        for ids in prompts:
            for mode, (sampling, spec) in modes.items():
                result = engine.generate(ids, sampling, spec)
                per_token[mode].append(result.stats.time_total / result.stats.generated)
                tau[mode].append(result.stats.tau)
    print(f"model {engine.target.name}, workload {args.workload}, {len(prompts)} prompts x "
          f"{args.rounds} rounds, {args.tokens} tokens, greedy; spec = {DEFAULT_SPEC.proposer} "
          f"adaptive k <= {DEFAULT_SPEC.k}, plain = no drafts")
    ms = {m: statistics.median(v) * 1e3 for m, v in per_token.items()}
    for mode in modes:
        print(f"{mode:10s} {ms[mode]:8.2f} ms/token  tau {statistics.median(tau[mode]):.2f}")
    print(f"on/off: spec {ms['spec on'] / ms['spec off']:.3f}, "
          f"plain {ms['plain on'] / ms['plain off']:.3f}")
    for k in (0, 4, 8):
        print(f"processor on a [{k + 1}, {engine.target.vocab_size}] block after 1000 tokens: "
              f"{processor_ms(engine.target.vocab_size, 1000, k):.3f} ms")


if __name__ == "__main__":
    main()
