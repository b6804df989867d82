"""verispec's device check: run it on a GPU as it is (scripts/gpu_check.sh wraps it),
read the one markdown report it writes.

Sections, each in its own try (a failure is reported, the rest still runs):
 1. bf16 matmul row invariance, M = 1..64, at the default model's and 8B shapes;
 2. the model: decode against verify blocks, bit for bit (the static path's self-check
    at several block widths, chains and a tree);
 3. greedy equality on the held-in workloads for every proposer;
 4. `verispec profile` on the device;
 5. speed against transformers' generate (eager, static cache) and prompt lookup;
 6. the cost of the batch-invariant cuBLAS settings: plain decoding in a child
    process without them (VERISPEC_CUDA_DEFAULT_BLAS=1), against this process.
Then the issue's goals, each marked met, missed or not measured.

`--cpu-dry-run` runs every section on the CPU, on a tiny random model with the
default model's tokenizer and small shapes: the code paths without CUDA, for CI.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

EIGHT_B = [(4096, 4096), (4096, 1024), (4096, 28672), (14336, 4096), (4096, 128256)]
PROPOSERS = ["ngram", "ngram+auto", "ngram+tree=16", "suffix+auto", "lookahead", "eagle",
             "eagle+tree=auto", "medusa", "auto", "self:8"]
# The dry run's tiny model has no trained heads and two layers.
DRY_PROPOSERS = ["ngram", "ngram+auto", "ngram+tree=16", "suffix+auto", "lookahead", "auto",
                 "self:1"]
SPEED_PROPOSERS = ["ngram+auto", "suffix+auto", "auto"]
SPEED_WORKLOADS = ["code-edit", "summarize", "chat"]
PEERS = "hf-plain,hf-static,hf-pld"
GOAL_PLAIN_TOK_S = 500.0
GOAL_SPEEDUP = 2.0
GOAL_SETTINGS_COST = 0.10


@dataclass
class Sizes:
    """How much each section runs: the GPU's, or the dry run's."""
    sweep_rows: int = 64
    sweep_shapes: list = field(default_factory=list)
    blocks: tuple = (2, 3, 5, 9, 16, 32)
    limit: int = 2
    max_new_tokens: int = 96
    profile_max_n: int = 64
    profile_repeats: int = 5
    speed_limit: int = 3
    speed_tokens: int = 128


def model_shapes(spec) -> list[tuple[int, int]]:
    """(in, out) of each matmul of a Llama spec: q/k/v fused, o, gate/up fused, down, head."""
    hidden, head_dim = spec.hidden_size, spec.head_dim
    qkv = (spec.num_heads + 2 * spec.num_kv_heads) * head_dim
    return [(hidden, qkv), (spec.num_heads * head_dim, hidden), (hidden, 2 * spec.intermediate_size),
            (spec.intermediate_size, hidden), (hidden, spec.vocab_size)]


# -- the sections ----------------------------------------------------------------
@torch.inference_mode()
def matmul_sweep(shapes: list[tuple[str, int, int]], rows: int, device: torch.device) -> str:
    """Each row of X[:M] @ W.T against the same row alone, bit for bit, M = 1..rows."""
    lines = ["| matmul (in x out) | of | M where a row differs from the row alone |", "|---|---|---|"]
    generator = torch.Generator(device="cpu").manual_seed(0)
    for where, k, n in shapes:
        weight = (torch.randn(n, k, generator=generator) / k ** 0.5).to(device, torch.bfloat16)
        x = torch.randn(rows, k, generator=generator).to(device, torch.bfloat16)
        alone = torch.cat([torch.nn.functional.linear(x[i:i + 1], weight) for i in range(rows)])
        broken = [m for m in range(1, rows + 1)
                  if not torch.equal(torch.nn.functional.linear(x[:m], weight), alone[:m])]
        lines.append(f"| {k} x {n} | {where} | {_ranges(broken) or 'none'} |")
        del weight
    return "\n".join(lines)


def model_bits(model, blocks) -> tuple[str, bool]:
    from verispec.models.row_check import check_rows

    lines = [f"start-up self-check: **{'ok' if model.row_check.ok else 'FAILED'}**: "
             f"{model.row_check.detail}", "", "| verify block rows | decode == verify |", "|---|---|"]
    ok = model.row_check.ok
    for block in blocks:
        result = check_rows(model, block)
        ok = ok and result.ok
        lines.append(f"| {block} | {'yes' if result.ok else 'NO: ' + result.detail} |")
    return "\n".join(lines), ok


def greedy_equality(engine, sizes: Sizes, proposers: list[str]) -> tuple[str, dict]:
    from verispec.bench.configs import VERISPEC, BenchConfig, proposer_spec
    from verispec.bench.runner import Runner, encode_prompts
    from verispec.bench.workloads import WORKLOADS, load_workload
    from verispec.config import SamplingParams
    from verispec.step.lossless import compare_greedy

    sampling = SamplingParams(max_new_tokens=sizes.max_new_tokens, seed=0)
    raw = [p for name in WORKLOADS for p in load_workload(name, sizes.limit)]
    prompts = encode_prompts(engine, raw, sampling)
    runner = Runner(engine, sampling)
    plain_config = BenchConfig("none", VERISPEC, "none", 0, proposer_spec("none", 0, None))
    plain = {p.id: runner.run(p, plain_config).token_ids for p in prompts}
    counts: dict[str, dict] = {}
    lines = ["| proposer | runs | identical | near-tie | mismatch | first mismatch |",
             "|---|---|---|---|---|---|"]
    for token in proposers:
        tally = {"runs": 0, "identical": 0, "near-tie": 0, "mismatch": 0}
        first = ""
        try:
            config = BenchConfig(token, VERISPEC, token, 8, proposer_spec(token, 8, None))
            for prompt in prompts:
                ids = runner.run(prompt, config).token_ids
                cmp = compare_greedy(engine.target, list(prompt.ids), plain[prompt.id], ids)
                kind = "identical" if cmp.identical else "near-tie" if cmp.near_tie else "mismatch"
                tally["runs"] += 1
                tally[kind] += 1
                if kind != "identical" and not first:
                    first = f"{prompt.id}: {cmp.describe()}"
        except Exception as exc:  # one proposer's failure must not hide the others' result
            first = f"error: {type(exc).__name__}: {exc}"
            tally["error"] = first
        counts[token] = tally
        lines.append(f"| {token} | {tally['runs']} | {tally['identical']} | {tally['near-tie']} "
                     f"| {tally['mismatch']} | {first} |")
    return "\n".join(lines), counts


def profile(engine, sizes: Sizes, out_dir: Path) -> tuple[str, dict]:
    from verispec.bench.bench_cli import run_profile
    from verispec.bench.profile import format_profile

    result, _, _ = run_profile(engine, context=512, max_n=sizes.profile_max_n,
                               repeats=sizes.profile_repeats, out=out_dir / "profile.json",
                               bandwidth_mb=64 if engine.target.device.type == "cpu" else None)
    text = format_profile(result, f"{engine.target.name} ({result.extra['dtype']}, "
                                  f"{result.extra['device']})")
    return "```\n" + text + "\n```", {"t1_ms": 1000 * result.t1}


def speed(engine, hf_engine, sizes: Sizes, out_dir: Path, peers: str) -> tuple[str, dict]:
    from verispec.bench.bench_cli import BenchPlan, execute
    from verispec.bench.configs import verispec_configs
    from verispec.bench.peers import parse_peers
    from verispec.config import SamplingParams

    sampling = SamplingParams(max_new_tokens=sizes.speed_tokens, seed=0)
    configs = verispec_configs(",".join(["none", *SPEED_PROPOSERS]), 8, None)
    selection = parse_peers(peers, 8, None)
    plan = BenchPlan(SPEED_WORKLOADS, configs + selection.configs, sampling, sizes.speed_limit,
                     notes=list(selection.notes))
    try:
        outcome = execute(engine, plan, out_dir / "bench", progress=False, peer_engine=hf_engine)
    except Exception as exc:  # hf-static compiles: where torch.compile fails, bench the rest
        if "hf-static" not in peers:
            raise
        rest = ",".join(p for p in peers.split(",") if p != "hf-static")
        text, value = speed(engine, hf_engine, sizes, out_dir, rest)
        return f"hf-static failed ({type(exc).__name__}: {exc}); without it:\n\n{text}", value
    best: dict[str, float] = {}
    plain: dict[str, float] = {}
    for row in outcome.rows:
        if row.kind != "verispec":
            continue
        if row.name == "none":
            plain[row.workload] = row.tokens_per_s
        elif row.vs_plain.mismatch == 0:
            best[row.workload] = max(best.get(row.workload, 0.0), row.tokens_per_s)
    return outcome.markdown, {"plain": plain, "best": best}


def plain_tok_s(engine, sizes: Sizes) -> float:
    """Median tok/s of plain decoding on the speed workloads' prompts (one warm-up)."""
    from verispec.bench.configs import VERISPEC, BenchConfig, proposer_spec
    from verispec.bench.runner import Runner, encode_prompts
    from verispec.bench.workloads import load_workload
    from verispec.config import SamplingParams

    sampling = SamplingParams(max_new_tokens=sizes.speed_tokens, seed=0)
    raw = [p for name in SPEED_WORKLOADS for p in load_workload(name, sizes.speed_limit)]
    prompts = encode_prompts(engine, raw, sampling)
    runner = Runner(engine, sampling)
    config = BenchConfig("none", VERISPEC, "none", 0, proposer_spec("none", 0, None))
    runner.run(prompts[0], config, replace(sampling, max_new_tokens=8))
    return statistics.median(runner.run(p, config).tokens_per_s for p in prompts)


def settings_cost(args, engine, sizes: Sizes, out_dir: Path) -> tuple[str, dict]:
    child_out = out_dir / "default_blas.json"
    command = [sys.executable, str(Path(__file__).resolve()), "--child-plain", str(child_out),
               "--model", args.model] + (["--cpu-dry-run"] if args.cpu_dry_run else [])
    env = {**os.environ, "VERISPEC_CUDA_DEFAULT_BLAS": "1"}
    child = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.child_timeout)
    if child.returncode != 0:
        raise RuntimeError(f"child exited {child.returncode}: {child.stderr[-2000:]}")
    other = json.loads(child_out.read_text())
    mine = plain_tok_s(engine, sizes)
    cost = 1.0 - mine / other["tok_s"]
    text = (f"plain decoding, median tok/s over the speed prompts: **{mine:.1f}** with the "
            f"batch-invariant settings, **{other['tok_s']:.1f}** with cuBLAS's defaults in a "
            f"child process: the settings cost **{100 * cost:.1f}%**.\n\nWithout them the "
            f"self-check says: {'ok' if other['row_check_ok'] else 'FAILED'} "
            f"({other['row_check']}).")
    return text, {"cost": cost, "with": mine, "without": other["tok_s"]}


# -- the run ---------------------------------------------------------------------
def _ranges(values: list[int]) -> str:
    out, start = [], None
    for i, v in enumerate(values):
        if start is None:
            start = v
        if i + 1 == len(values) or values[i + 1] != v + 1:
            out.append(str(start) if start == v else f"{start}-{v}")
            start = None
    return ", ".join(out)


def tiny_model(folder: Path) -> Path:
    """A random 2-layer Llama with the default model's tokenizer and vocabulary."""
    if (folder / "config.json").exists():
        return folder
    from transformers import LlamaConfig, LlamaForCausalLM

    from verispec.models.loading import default_gguf_path, gguf_tokenizer

    tokenizer = gguf_tokenizer(default_gguf_path(), quiet=True)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, initializer_range=0.25,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
                         tie_word_embeddings=True)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def load_engines(args):
    """The engine under test, and a transformers twin for the peers (None if unwanted)."""
    from verispec import Engine
    from verispec.models.row_check import check_rows
    from verispec.models.static_llama import StaticLlama

    if not args.cpu_dry_run:
        engine = Engine(args.model, device="cuda")
        if not isinstance(engine.target, StaticLlama):
            raise RuntimeError(f"{engine.target.name} did not load on the static CUDA path "
                               f"(backend {engine.backend} {engine.backend_note})")
        hf = Engine(args.model, device="cuda", backend="hf") if args.peers else None
        return engine, hf
    args.model = str(tiny_model(Path(args.model)))
    engine = Engine(args.model, device="cpu", dtype="fp32", backend="native")
    engine.target = StaticLlama.from_native(engine.target, width=8, graphs=False)
    engine.target.row_check = check_rows(engine.target)
    hf = Engine(args.model, device="cpu", dtype="fp32", backend="hf") if args.peers else None
    return engine, hf


def environment(args, engine) -> list[str]:
    from verispec.models.cuda_setup import batch_invariant_blas

    lines = [f"- date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}"]
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    lines.append(f"- verispec commit: {commit or 'unknown'}; model: {engine.target.name} "
                 f"({str(engine.target.dtype).replace('torch.', '')}, {engine.target.device}, "
                 f"step width {getattr(engine.target, 'width', '-')})")
    if torch.cuda.is_available() and not args.cpu_dry_run:
        props = torch.cuda.get_device_properties(0)
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.strip()
        lines.append(f"- GPU: {props.name}, {props.total_memory >> 30} GiB, capability "
                     f"{props.major}.{props.minor}; nvidia-smi: {smi or 'unavailable'}")
        lines.append(f"- torch {torch.__version__}, CUDA {torch.version.cuda}, cuBLAS settings: "
                     f"{batch_invariant_blas()}")
    else:
        lines.append(f"- CPU dry run: torch {torch.__version__}, no CUDA")
    import transformers

    lines.append(f"- transformers {transformers.__version__}")
    return lines


def goals(results: dict) -> list[str]:
    out = ["## The issue's goals", ""]
    speed_result = results.get("speed")
    if speed_result:
        plain = speed_result["plain"]
        slowest = min(plain.values()) if plain else None
        out.append(_goal(f"plain decoding >= {GOAL_PLAIN_TOK_S:.0f} tok/s",
                         slowest is not None and slowest >= GOAL_PLAIN_TOK_S,
                         f"{slowest:.1f} tok/s on the slowest workload" if slowest else "no data"))
        for workload in ("code-edit", "summarize"):
            if workload in plain and workload in speed_result["best"]:
                ratio = speed_result["best"][workload] / plain[workload]
                out.append(_goal(f"best lossless >= {GOAL_SPEEDUP:.0f}x plain on {workload}",
                                 ratio >= GOAL_SPEEDUP, f"{ratio:.2f}x"))
    else:
        out.append("- speed: not measured")
    equality = results.get("equality")
    if equality:
        runs = sum(t["runs"] for t in equality.values())
        same = sum(t["identical"] for t in equality.values())
        errors = [name for name, t in equality.items() if "error" in t]
        out.append(_goal("100% of speculative runs bit-identical to plain", runs and same == runs
                         and not errors, f"{same}/{runs} identical"
                         + (f"; errors in {', '.join(errors)}" if errors else "")))
    else:
        out.append("- greedy equality: not measured")
    cost = results.get("cost")
    out.append(_goal(f"batch-invariant settings cost <= {100 * GOAL_SETTINGS_COST:.0f}%",
                     cost["cost"] <= GOAL_SETTINGS_COST, f"{100 * cost['cost']:.1f}%")
               if cost else "- settings cost: not measured")
    return out


def _goal(what: str, met: bool, detail: str) -> str:
    return f"- {'met' if met else 'MISSED'}: {what} ({detail})"


def run(args) -> int:
    started = time.perf_counter()
    dry = args.cpu_dry_run
    if dry:
        torch.set_num_threads(1)  # a tiny model's matmuls only wait on a second thread
    sizes = Sizes(sweep_rows=8, blocks=(2, 3, 5, 8, 9), limit=1, max_new_tokens=12, profile_max_n=8,
                  profile_repeats=1, speed_limit=1, speed_tokens=12) if dry else Sizes()
    out_dir = Path(args.work or tempfile.mkdtemp(prefix="verispec-gpu-check-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    report: list[str] = ["# verispec GPU check", ""]
    results: dict = {}
    engine, hf_engine = load_engines(args)
    report += environment(args, engine)
    device = engine.target.device
    shapes = [("model", k, n) for k, n in model_shapes(engine.target.spec)]
    shapes += [("8B", k, n) for k, n in (EIGHT_B if not dry else [(96, 64), (64, 160)])]

    def section(title: str, key: str, body) -> None:
        elapsed = time.perf_counter() - started
        report.extend(["", f"## {title}", ""])
        if elapsed > args.budget:
            report.append(f"not run: {elapsed:.0f} s spent, past the budget of {args.budget} s")
            return
        t0 = time.perf_counter()
        try:
            text, value = body()
            results[key] = value
            report.append(text)
        except Exception:
            report.append("FAILED:\n```\n" + traceback.format_exc()[-3000:] + "```")
        report.append(f"\n({time.perf_counter() - t0:.1f} s)")
        print(f"gpu_check: {title} done at {time.perf_counter() - started:.0f} s", file=sys.stderr)

    section("1. bf16 matmul row invariance", "sweep",
            lambda: (matmul_sweep(shapes, sizes.sweep_rows, device), None))
    section("2. Model: decode against verify blocks", "bits",
            lambda: model_bits(engine.target, sizes.blocks))
    section("3. Greedy equality on the held-in workloads, every proposer", "equality",
            lambda: greedy_equality(engine, sizes, DRY_PROPOSERS if dry else PROPOSERS))
    section("4. verispec profile", "profile", lambda: profile(engine, sizes, out_dir))
    section("5. Speed against transformers", "speed",
            lambda: speed(engine, hf_engine, sizes, out_dir, args.peers))
    section("6. What the batch-invariant settings cost", "cost",
            lambda: settings_cost(args, engine, sizes, out_dir))
    report += [""] + goals(results)
    report += ["", f"total: {time.perf_counter() - started:.0f} s"]
    Path(args.out).write_text("\n".join(report) + "\n", encoding="utf-8")
    print(f"gpu_check: report written to {args.out}", file=sys.stderr)
    return 0


def child_plain(args) -> int:
    """The settings-cost child: plain tok/s and the self-check under cuBLAS's defaults."""
    args.peers = ""
    engine, _ = load_engines(args)
    sizes = Sizes(speed_limit=1, speed_tokens=12) if args.cpu_dry_run else Sizes()
    check = engine.target.row_check
    Path(args.child_plain).write_text(json.dumps(
        {"tok_s": plain_tok_s(engine, sizes), "row_check_ok": check.ok, "row_check": check.detail}))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="gpu_check_report.md", help="the report (markdown)")
    parser.add_argument("--model", default=None,
                        help="model to check (default: the embedded default model; in a dry "
                             "run, a folder for the tiny model)")
    parser.add_argument("--peers", default=PEERS, help="transformers peers of section 5 ('' = none)")
    parser.add_argument("--budget", type=float, default=360.0,
                        help="seconds after which the remaining sections are skipped")
    parser.add_argument("--work", default=None, help="folder for the sections' own files")
    parser.add_argument("--child-timeout", type=float, default=150.0)
    parser.add_argument("--cpu-dry-run", action="store_true",
                        help="run every section on the CPU with a tiny model and small shapes")
    parser.add_argument("--child-plain", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.model is None:
        args.model = str(Path(tempfile.gettempdir()) / "verispec-gpu-check-tiny") \
            if args.cpu_dry_run else "default"
    if not args.cpu_dry_run and not torch.cuda.is_available():
        parser.error("no CUDA device: run on a GPU, or use --cpu-dry-run")
    return child_plain(args) if args.child_plain else run(args)


if __name__ == "__main__":
    sys.exit(main())
