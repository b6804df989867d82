"""The host-side cost of sampled decoding per verified row, at the default model's
vocabulary: temperature + top_p by a full sort (the first code), by the top-m selection
in torch calls (`sampling.torch_probs`, the path off CPU) and natively
(`sampling.logits_to_probs` on CPU, kernels/sampling.cpp); one draw by torch.multinomial,
by the inversion in torch calls (`sampling.torch_draw`) and natively (`sampling.sample`).
Rows: the default model's own logits over the last positions of one prompt per
workload, so the nucleus sizes are real ones.

    OMP_NUM_THREADS=1 python scripts/sampling_cost.py [--rows 100] [--repeats 3]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from verispec import kernels
from verispec.api import Engine
from verispec.bench.workloads import load_workload
from verispec.config import SamplingParams
from verispec.step.sampling import logits_to_probs, make_generator, sample, torch_draw, torch_probs


def sorted_top_p(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The previous implementation: sort the vocabulary, then the mass-before rule."""
    logits = logits.float() / params.temperature
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    sorted_probs = sorted_logits.softmax(-1)
    drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= params.top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf")).softmax(-1)


def per_row_ms(fn, rows: torch.Tensor, repeats: int) -> float:
    """Median over repeats of the mean milliseconds of fn over the rows, one at a time."""
    fn(rows[0])
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for row in rows:
            fn(row)
        times.append((time.perf_counter() - start) / len(rows) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100, help="rows per workload prompt")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-p", type=float, default=0.9)
    parser.add_argument("--top-k", type=int, default=0, help="top_k with top_p (0: off)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    engine = Engine()
    real = []
    for workload in ("chat", "code-edit", "creative", "humaneval"):
        ids = engine.encode_messages(list(load_workload(workload, 1)[0].messages))
        out = engine.target.forward(torch.tensor(ids), engine.target.new_cache(),
                                    num_logits=min(args.rows, len(ids)))
        real.append(out.logits[-args.rows:])
    rows = torch.cat(real)  # [rows, vocab]
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    sizes = logits_to_probs(rows, params).gt(0).sum(-1).float()
    probs = logits_to_probs(rows[:100], params)
    tempered = SamplingParams(temperature=args.temperature)
    gen = make_generator(0)
    n = args.repeats
    uniforms = torch.rand(1, generator=gen, dtype=torch.float64)
    costs = {
        "temperature only, torch calls": per_row_ms(lambda r: torch_probs(r, tempered), rows, n),
        "temperature only, native": per_row_ms(lambda r: logits_to_probs(r, tempered), rows, n),
        **({} if args.top_k else {  # the first code had no top_k
            "top_p, full sort (first code)": per_row_ms(lambda r: sorted_top_p(r, params), rows, n)}),
        "top_p, top-m selection in torch calls": per_row_ms(lambda r: torch_probs(r, params), rows, n),
        "top_p, native": per_row_ms(lambda r: logits_to_probs(r, params), rows, n),
        "one draw, torch.multinomial": per_row_ms(lambda p: torch.multinomial(p, 1, generator=gen), probs, n),
        "one draw, inversion in torch calls": per_row_ms(lambda p: torch_draw(p[None], uniforms), probs, n),
        "one draw, native": per_row_ms(lambda p: sample(p, gen), probs, n),
    }
    print(f"native kernels: {'yes' if kernels.available() else 'no (the native rows are the torch path)'}")
    print(f"{len(rows)} rows of the default model (vocab {rows.shape[-1]}), T={args.temperature}, "
          f"top_p={args.top_p}, top_k={args.top_k}; nucleus size median {sizes.median():.0f}, "
          f"90th percentile {sizes.quantile(0.9):.0f}, max {sizes.max():.0f}")
    print("| step | ms per row |\n|---|---|")
    for name, ms in costs.items():
        print(f"| {name} | {ms:.3f} |")


if __name__ == "__main__":
    main()
