"""Plain decoding cost of a GGUF file's quantized weights in verispec's kernels,
against the same file dequantized to dense bf16. llama.cpp is not timed here: beside torch
in one process its OpenMP pool and torch's share the cores (and OMP_WAIT_POLICY, set for
either, slows the other); scripts/quant_scale.py times it in a process of its own.

Contenders take turns one decode step at a time (each on its own cache, the
context growing by one token per step), so load from other processes hits them
alike; figures are medians. Also: the memory-bandwidth bound of the bytes each
token reads, T(n)/T(1) of an n-token forward (verification cost), and peak RSS
at load and while decoding (each contender in a fresh process).

  python scripts/quant_speed.py                      # default model, 1 and 2 threads
  python scripts/quant_speed.py --model /work/synth/synth-0.5b-Q4_K_M.gguf --no-dense
  python scripts/quant_speed.py --rss                # peak RSS instead of timings
  python scripts/quant_speed.py --json out.json --profile-out profile.json
      # also the figures as JSON, and the first thread count's T(n) as a cost
      # profile that `verispec calc --profile` reads
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's verispec

import torch  # noqa: E402


def load(kind: str, model: str | None):
    from verispec.models.loading import load_target

    return load_target(model, dtype="bf16", weights=kind).target


def read_bandwidth_gbs(nbytes: int = 1 << 29, repeats: int = 5) -> float:
    """Read bandwidth (GB/s) of a sum over a buffer far larger than the caches."""
    buffer = torch.ones(nbytes // 4, dtype=torch.float32)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        buffer.sum()
        times.append(time.perf_counter() - start)
    return nbytes / statistics.median(times) / 1e9


def weight_bytes(model) -> int:
    """Bytes one decode step reads: every layer matrix and the LM head (the
    embedding lookup reads a row)."""
    w = model.weights
    lins = [lin for layer in model.layers for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    lins.append(w.lm_head)
    total = 0
    for lin in lins:
        parts = getattr(lin, "parts", [lin])
        total += sum(p.weight.numel() * p.weight.element_size() for p in parts)
    return total


def decode_ms(models: dict, tokens: list[int], context: int, steps: int, threads: int,
              cpu_out: dict | None = None) -> dict:
    """Median wall ms per decode step per contender; `cpu_out` gets the median CPU
    ms of the process over the step (all threads), which other sessions' load on
    a shared machine does not inflate the way it does the wall time."""
    torch.set_num_threads(threads)
    caches = {}
    for label, model in models.items():
        caches[label] = model.new_cache(context + steps + 1)
        model.forward(torch.tensor(tokens[:context]), caches[label], num_logits=1)
    times = {label: [] for label in models}
    cpu = {label: [] for label in models}
    for step in range(steps):
        token = tokens[context + step]
        for label, model in models.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            model.forward(torch.tensor([token]), caches[label])
            times[label].append(time.perf_counter() - start)
            cpu[label].append(time.process_time() - start_cpu)
    if cpu_out is not None:
        cpu_out.update({label: statistics.median(v) * 1e3 for label, v in cpu.items()})
    return {label: statistics.median(v) * 1e3 for label, v in times.items()}


def cost_curve(model, tokens: list[int], context: int, ns: list[int], repeats: int,
               cpu_out: dict | None = None, cache=None) -> dict:
    """Median wall ms of an n-token forward (all logits) after `context` for each n
    in `ns`, interleaved over n and rolled back after each; `cpu_out` gets the
    process CPU ms (at one thread, the cost other sessions' load leaves alone).
    A `cache` given already holds `tokens[:context]`."""
    max_n = max(ns)
    if cache is None:
        cache = model.new_cache(context + max_n + 1)
        model.forward(torch.tensor(tokens[:context]), cache, num_logits=1)
    times = {n: [] for n in sorted(ns)}
    cpu = {n: [] for n in sorted(ns)}
    block = torch.tensor(tokens[context:context + max_n])
    for _ in range(repeats):
        for n in times:
            start, start_cpu = time.perf_counter(), time.process_time()
            model.forward(block[:n], cache)
            times[n].append(time.perf_counter() - start)
            cpu[n].append(time.process_time() - start_cpu)
            cache.truncate(context)
    if cpu_out is not None:
        cpu_out.update({n: statistics.median(v) * 1e3 for n, v in cpu.items()})
    return {n: statistics.median(v) * 1e3 for n, v in times.items()}


def rss_child(kind: str, model: str | None, threads: int) -> dict:
    """Run in a fresh process: peak RSS (MiB) after load and after 64 decode steps."""
    import resource

    torch.set_num_threads(threads)
    loaded = load(kind, model)
    after_load = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    tokens = list(range(1000, 1300))
    decode_ms({kind: loaded}, tokens, 200, 64, threads)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"kind": kind, "load_peak_mib": round(after_load), "decode_peak_mib": round(peak)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 2)[-1])
    p.add_argument("--model", default=None, help="a .gguf file (default: the embedded model)")
    p.add_argument("--threads", default="1,2", help="comma list of thread counts")
    p.add_argument("--context", type=int, default=200)
    p.add_argument("--steps", type=int, default=64, help="decode steps per contender")
    p.add_argument("--max-n", type=int, default=32, help="largest n of T(n)/T(1)")
    p.add_argument("--ns", default=None, help="the n of T(n)/T(1) as a comma list (default 1..max-n)")
    p.add_argument("--repeats", type=int, default=7, help="repeats per n of T(n)")
    p.add_argument("--no-dense", action="store_true", help="skip the dense bf16 contender")
    p.add_argument("--rss", action="store_true", help="peak RSS per contender instead")
    p.add_argument("--rss-child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--json", default=None, metavar="FILE", help="also write the figures as JSON")
    p.add_argument("--profile-out", default=None, metavar="FILE",
                   help="write the first thread count's quantized T(n) for `verispec calc --profile`; "
                        "a name with {threads} gets one file per thread count")
    args = p.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    if args.rss_child:
        print(json.dumps(rss_child(args.rss_child, args.model, threads[0])))
        return 0
    kinds = ["quant"] + ([] if args.no_dense else ["dense"])
    if args.rss:
        from verispec.models.loading import gguf_source

        size = gguf_source(args.model).stat().st_size / 2**20
        print(f"file {size:.0f} MiB")
        report = {"file_mib": round(size), "rss": []}
        for kind in kinds:
            out = subprocess.run([sys.executable, __file__, "--rss-child", kind, "--threads",
                                  str(threads[0])] + (["--model", args.model] if args.model else []),
                                 capture_output=True, text=True, check=True)
            print(out.stdout.strip().splitlines()[-1])
            report["rss"].append(json.loads(out.stdout.strip().splitlines()[-1]))
        write_json(args.json, report)
        return 0
    models = {kind: load(kind, args.model) for kind in kinds}
    ns = sorted({1, *(int(n) for n in args.ns.split(","))}) if args.ns else list(range(1, args.max_n + 1))
    tokens = list(range(1000, 1000 + args.context + args.steps + max(ns) + 1))
    report = {"model": args.model, "context": args.context, "threads": {}, "weights_mib": {}}
    for kind in ("quant", "dense"):
        if kind in models:
            mib = weight_bytes(models[kind]) / 2**20
            report["weights_mib"][kind] = round(mib, 1)
            print(f"{kind}: {mib:.1f} MiB of weights read per token")
    for t in threads:
        torch.set_num_threads(t)
        bw = read_bandwidth_gbs()
        cpu_ms: dict = {}
        ms = decode_ms(models, tokens, args.context, args.steps, t, cpu_ms)
        line = ", ".join(f"{k} {v:.2f} ms (CPU {cpu_ms[k]:.2f})" for k, v in ms.items())
        bound = weight_bytes(models["quant"]) / bw / 1e6
        ratios = ", ".join(f"{k}/quant {v / ms['quant']:.2f}x" for k, v in ms.items() if k != "quant")
        print(f"threads {t}: {line}; {ratios}; read bandwidth {bw:.1f} GB/s -> quant bound "
              f"{bound:.2f} ms ({bound / ms['quant']:.0%} of it reached)")
        report["threads"][t] = {"decode_ms": ms, "decode_cpu_ms": cpu_ms, "read_gbs": bw, "quant_bound_ms": bound}
    for t in threads:
        torch.set_num_threads(t)
        cpu_curve: dict = {}
        curve = cost_curve(models["quant"], tokens, args.context, ns, args.repeats, cpu_curve)
        ratios = " ".join(f"{n}:{curve[n] / curve[1]:.2f}" for n in curve)
        cpu_ratios = " ".join(f"{n}:{cpu_curve[n] / cpu_curve[1]:.2f}" for n in cpu_curve)
        print(f"threads {t}: quant T(n)/T(1), T(1) {curve[1]:.2f} ms: {ratios}")
        print(f"threads {t}: quant T(n)/T(1) in CPU time, T(1) {cpu_curve[1]:.2f} ms: {cpu_ratios}")
        report["threads"][t]["quant_tn_ms"] = curve
        report["threads"][t]["quant_tn_cpu_ms"] = cpu_curve
        if args.profile_out and ("{threads}" in args.profile_out or t == threads[0]):
            # At one thread the CPU-time curve: the wall one is the machine's load as much as the model.
            use = cpu_curve if t == 1 else curve
            write_json(args.profile_out.replace("{threads}", str(t)),
                       {"n": list(use), "seconds": [v / 1e3 for v in use.values()], "model": args.model,
                        "threads": t, "context": args.context, "clock": "cpu" if t == 1 else "wall"})
    write_json(args.json, report)
    return 0


def write_json(path: str | None, data: dict) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
