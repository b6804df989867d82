"""What the logit processors cost: speculative decoding with penalties on
against off, on the same prompts, interleaved run by run (medians), and the
processor's own time on a verified block.

    python scripts/penalty_cost.py [--workload chat,code-edit] [--prompts 3] [--tokens 96]

Greedy; speculative (the default: n-gram lookup, adaptive k) and plain, each
with penalties off and on. The penalties are mild (presence 0.3, frequency
0.3, repetition 1.1, three logit_bias entries). Plain on/off isolates the
processors' own cost; speculative on/off adds what penalties do to acceptance:
they discourage repeating the context, which is what n-gram lookup drafts.
Each mode's time per token is reported as wall time and as the process's CPU
time (steadier on a shared machine), with tau, per workload.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from verispec import Engine, SamplingParams, SpecConfig
from verispec.bench.workloads import load_workload, parse_workloads
from verispec.config import DEFAULT_SPEC
from verispec.step.processors import LogitProcessor, chain_ancestry

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
    parser.add_argument("--workload", default="chat,code-edit",
                        help="comma list of workloads (default chat,code-edit)")
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved repeats per prompt")
    args = parser.parse_args()
    engine = Engine("default")
    workloads = parse_workloads(args.workload)
    prompts = [(name, engine.encode_messages(list(p.messages)))
               for name in workloads for p in load_workload(name, limit=args.prompts)]
    off = SamplingParams(max_new_tokens=args.tokens)
    on = SamplingParams(max_new_tokens=args.tokens, **PENALTIES)
    plain = SpecConfig("none", k=0)
    modes = {"spec off": (off, DEFAULT_SPEC), "spec on": (on, DEFAULT_SPEC),
             "plain off": (off, plain), "plain on": (on, plain)}
    names = list(modes)
    wall = {(w, m): [] for w in workloads for m in modes}
    cpu = {(w, m): [] for w in workloads for m in modes}
    tau = {(w, m): [] for w in workloads for m in modes}
    decode = {(w, m): [] for w in workloads for m in modes}  # prefill excluded
    for round_ in range(args.rounds):
        for i, (name, ids) in enumerate(prompts):
            # Rotate the order per prompt and round: no mode always runs first or last.
            shift = (i + round_) % len(names)
            for mode in names[shift:] + names[:shift]:
                sampling, spec = modes[mode]
                cpu0 = time.process_time()
                result = engine.generate(ids, sampling, spec)
                cpu[name, mode].append((time.process_time() - cpu0) / result.stats.generated)
                wall[name, mode].append(result.stats.time_total / result.stats.generated)
                decode[name, mode].append((result.stats.time_total - result.stats.time_prefill)
                                          / result.stats.generated)
                tau[name, mode].append(result.stats.tau)
    print(f"model {engine.target.name}, {len(prompts)} prompts x {args.rounds} rounds, "
          f"{args.tokens} tokens, greedy, {torch.get_num_threads()} torch threads; spec = "
          f"{DEFAULT_SPEC.proposer} adaptive k <= {DEFAULT_SPEC.k}, plain = no drafts; "
          "medians over prompts and rounds")
    print("| workload | mode | ms/token (wall) | decode ms/token | CPU ms/token | tau |\n"
          "|---|---|---|---|---|---|")
    med = {key: statistics.median(v) * 1e3 for key, v in wall.items()}
    med_dec = {key: statistics.median(v) * 1e3 for key, v in decode.items()}
    med_cpu = {key: statistics.median(v) * 1e3 for key, v in cpu.items()}
    for name in workloads:
        for mode in names:
            print(f"| {name} | {mode} | {med[name, mode]:.2f} | {med_dec[name, mode]:.2f} "
                  f"| {med_cpu[name, mode]:.2f} "
                  f"| {statistics.median(tau[name, mode]):.2f} |")
    for name in workloads:
        ratios = {kind: (med[name, f"{kind} on"] / med[name, f"{kind} off"],
                         med_cpu[name, f"{kind} on"] / med_cpu[name, f"{kind} off"])
                  for kind in ("spec", "plain")}
        speedup = {state: med_dec[name, f"plain {state}"] / med_dec[name, f"spec {state}"]
                   for state in ("off", "on")}
        print(f"{name}: on/off wall (CPU) spec {ratios['spec'][0]:.3f} ({ratios['spec'][1]:.3f}), "
              f"plain {ratios['plain'][0]:.3f} ({ratios['plain'][1]:.3f}); speculative decode "
              f"speedup over plain: penalties off {speedup['off']:.2f}x, on {speedup['on']:.2f}x")
    for k in (0, 4, 8):
        print(f"processor on a [{k + 1}, {engine.target.vocab_size}] block after 1000 tokens: "
              f"{processor_ms(engine.target.vocab_size, 1000, k):.3f} ms")


if __name__ == "__main__":
    main()
