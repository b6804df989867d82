"""CPU time per token and per EAGLE proposal, in situ: generate greedily on bench
prompts with each configuration and time every `EagleProposer.propose` call with
the process's CPU clock (run it with OMP_NUM_THREADS=1, so CPU time is one core's).

    OMP_NUM_THREADS=1 python scripts/eagle_draft_cost.py --workload chat,creative --limit 3 \\
        none "eagle k=1" "eagle+head-quant=Q8_0+head-vocab=4096 k=1"

A configuration is a bench proposer token (verispec.spec_text.parse_token) and
its k. tau and alpha do not depend on the machine's load; the CPU times do
(memory bandwidth is shared), so compare configurations of one run only.
"""
from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("configs", nargs="*", default=["none", "eagle k=1", "eagle k=2"])
    parser.add_argument("--workload", default="chat,creative")
    parser.add_argument("--limit", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)

    from verispec import Engine, SamplingParams
    from verispec.bench.workloads import load_workload
    from verispec.spec_text import parse_token
    from verispec.proposers.eagle import EagleProposer

    engine = Engine("default")
    prompts = [engine.encode_messages(list(p.messages))
               for w in args.workload.split(",") for p in load_workload(w, args.limit)]
    clock = {"seconds": 0.0, "calls": 0}
    propose = EagleProposer.propose

    def timed(self, ctx, k):
        start = time.process_time()
        try:
            return propose(self, ctx, k)
        finally:
            clock["seconds"] += time.process_time() - start
            clock["calls"] += 1

    EagleProposer.propose = timed
    print(f"{'config':44s} {'cpu ms/token':>12s} {'ms/propose':>10s} {'draft share':>11s} "
          f"{'tau':>6s} {'alpha':>6s}")
    for label in args.configs:
        token, _, k = label.partition(" k=")
        spec = parse_token(token, {"k": 0 if token == "none" else int(k or 4)})
        clock.update(seconds=0.0, calls=0)
        generated = passes = drafted = accepted = 0
        start = time.process_time()
        for ids in prompts:
            stats = engine.generate(ids, SamplingParams(max_new_tokens=args.max_new_tokens), spec).stats
            generated += stats.generated
            passes += stats.target_forwards
            drafted += stats.drafted
            accepted += stats.accepted
        total = time.process_time() - start
        print(f"{label:44s} {total / generated * 1e3:12.3f} "
              f"{clock['seconds'] / max(1, clock['calls']) * 1e3:10.3f} {clock['seconds'] / total:11.3f} "
              f"{generated / max(1, passes):6.3f} {accepted / max(1, drafted):6.3f}")


if __name__ == "__main__":
    main()
