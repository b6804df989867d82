"""Side-by-side decode timing: native backend vs transformers eager.

Contenders take turns one forward at a time, so drift on a shared machine hits
them alike; reported numbers are medians over steps.

    python scripts/native_speed.py [--threads 1] [--context 200] [--steps 60]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from verispec.models.hf import HFModel
from verispec.models.llama import NativeLlama
from verispec.models.loading import load_hf, resolve_model_dir


def interleaved_ms(runs: dict, tokens: torch.Tensor, context: int, steps: int) -> dict:
    """Median ms of one forward per contender, taking turns step by step so that
    load from other processes hits every contender alike.

    `runs` maps a label to (model, n): an n-token forward (all logits, as in
    verification) after a `context`-token prefill, rolled back after each step.
    """
    caches = {}
    for label, (model, _) in runs.items():
        caches[label] = model.new_cache()
        model.forward(tokens[:context], caches[label], num_logits=1)
    times = {label: [] for label in runs}
    for _ in range(steps):
        for label, (model, n) in runs.items():
            start = time.perf_counter()
            model.forward(tokens[context:context + n], caches[label])
            times[label].append(time.perf_counter() - start)
            caches[label].truncate(context)
    return {label: statistics.median(values) * 1e3 for label, values in times.items()}


def read_bandwidth_gbs() -> float:
    """Read bandwidth from summing a tensor far larger than the last-level cache."""
    big = torch.ones(256 * 1024 * 1024 // 4)
    big.sum()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        big.sum()
        times.append(time.perf_counter() - start)
    return big.numel() * 4 / statistics.median(times) / 1e9


def copy_bandwidth_gbs() -> float:
    src = torch.ones(256 * 1024 * 1024 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - start)
    return 2 * src.numel() * 4 / statistics.median(times) / 1e9


def weight_bytes(model: NativeLlama) -> int:
    """Bytes of matrices one forward streams; the embedding is only gathered, so not counted."""
    head = model.weights.lm_head
    mats = [head.out_features * head.in_features]
    for layer in model.layers:
        for lin in (layer.qkv, layer.o, layer.gate_up, layer.down):
            mats.append(lin.out_features * lin.in_features)
    return sum(mats) * torch.finfo(model.dtype).bits // 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads; 1 keeps timings stable on a shared machine")
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--model", default=None, help="model source (default: embedded SmolLM2)")
    parser.add_argument("--no-hf", action="store_true", help="skip the transformers contenders")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    folder = resolve_model_dir(args.model)

    by_ops = NativeLlama.from_dir(folder, torch.bfloat16)
    by_ops._fused = False  # the same kernels, but each layer as ~20 PyTorch ops
    # bf16 on verispec's kernels is batch-invariant by construction: no separate row.
    contenders = {"native bf16": NativeLlama.from_dir(folder, torch.bfloat16),
                  "native bf16 op-by-op": by_ops,
                  "native fp32": NativeLlama.from_dir(folder, torch.float32),
                  "native fp32 invariant": NativeLlama.from_dir(folder, torch.float32,
                                                                batch_invariant=True)}
    if not args.no_hf:
        contenders["hf eager bf16"] = HFModel(load_hf(args.model, "bf16").model)
        contenders["hf eager fp32"] = HFModel(load_hf(args.model, "fp32").model)
    native = contenders["native bf16"]
    tokens = torch.randint(0, native.vocab_size, (args.context + 64,),
                           generator=torch.Generator().manual_seed(0))

    sizes = (1, 2, 4, 8, 16, 32)
    with torch.inference_mode():
        decode = interleaved_ms({name: (model, 1) for name, model in contenders.items()},
                                tokens, args.context, args.steps)
        blocks = interleaved_ms({n: (native, n) for n in sizes}, tokens, args.context, args.steps)

    print(f"threads={args.threads} context={args.context} steps={args.steps} model={native.name}")
    print("plain decode, ms per 1-token forward (median, interleaved):")
    base = decode.get("hf eager bf16")
    for name, ms in decode.items():
        speedup = f"  {base / ms:4.2f}x vs hf eager bf16" if base else ""
        print(f"  {name:24s} {ms:7.2f}{speedup}")
    print("native bf16 n-token forward at the same context:")
    for n in sizes:
        print(f"  n={n:2d}  {blocks[n]:7.2f} ms  T(n)/T(1) = {blocks[n] / blocks[1]:4.2f}")
    read, copy = read_bandwidth_gbs(), copy_bandwidth_gbs()
    nbytes = weight_bytes(native)
    print(f"bandwidth: read {read:.1f} GB/s (sum), copy {copy:.1f} GB/s (read+write)")
    print(f"bandwidth bound: {nbytes / 1e6:.0f} MB of bf16 matmul weights / {read:.1f} GB/s "
          f"= {nbytes / read / 1e6:.2f} ms per forward")


if __name__ == "__main__":
    main()
