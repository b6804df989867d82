"""`verispec bench` and `verispec profile`. `verispec/cli/main.py` mounts them via
`add_subcommands`; every flag is validated before the model loads, so a typo
costs a second, not a model load. User errors raise ValueError (exit 2)."""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from verispec.bench import plots, report
from verispec.bench.configs import PEER, BenchConfig, parse_k_list, verispec_configs
from verispec.bench.peers import needs_hf, parse_peers
from verispec.bench.runner import (
    BenchPrompt,
    Runner,
    RunRecord,
    check_equality,
    encode_prompts,
    environment,
    run_bench,
)
from verispec.bench.workloads import WORKLOADS, load_workload, parse_workloads
from verispec.cli.args import (
    add_model_args,
    add_suffix_cache_arg,
    engine_from,
    load_suffix_cache,
    save_suffix_cache,
)
from verispec.config import SamplingParams

_BENCH_EPILOG = """\
examples:
  verispec bench --workload chat,summarize --proposer none,ngram --peers hf-plain,hf-pld --limit 2
  verispec bench --workload all --proposer none,ngram,self:8 --k 4 --max-new-tokens 128
  verispec bench --workload my_prompts.jsonl --proposer none,ngram,ngram+auto
  verispec bench --workload code-edit --proposer ngram --sweep-k 1..10 --out results/sweep
  verispec bench --workload chat --proposer none,ngram --peers llamaserver-plain,llamaserver-ngram-mod
  verispec bench --workload predicted-edit --proposer none,ngram+auto,ngram+auto+prediction --max-new-tokens 512

proposer tokens: none (plain decoding, the equality reference), ngram, self:L
(the target's first L layers as draft), draft (--draft PATH), or any registered
proposer name. Every configuration runs on the same token ids, interleaved per
prompt; greedy outputs are checked against `none` and against hf-plain.

peers: hf-plain, hf-static, hf-pld, hf-assisted (transformers on the same weights)
and llamaserver-plain, llamaserver-ngram-mod, -ngram-simple,
-ngram-map-k, -ngram-map-k4v, -ngram-cache, -draft (llama.cpp's own llama-server
in its own process over HTTP, at verispec's thread count; build it once with
scripts/build_llama_cpp.sh and set VERISPEC_LLAMA_CPP_DIR to its --dir, or set
VERISPEC_LLAMA_SERVER to a binary; docs/benchmarks.md). llama.cpp quantizes
its activations to 8 bits, a different function, so its speculative runs are
checked against its own plain run only.
"""

_PROFILE_EPILOG = """\
examples:
  verispec profile --out profile.json
  verispec profile --draft self:8 --context 1024 --max-n 16 --repeats 9
  verispec calc --alpha 0.8 --k 4 --profile profile.json    # use the measured curve
"""


@dataclass
class BenchPlan:
    """Everything `bench` will run, checked before any model is loaded."""
    workloads: list[str]
    configs: list[BenchConfig]
    sampling: SamplingParams
    limit: int | None = None
    draft: str | None = None
    sweep: list[int] | None = None
    notes: list[str] = field(default_factory=list)
    model: str | None = None  # what --model named: llama.cpp peers read it as a GGUF
    repeats: int = 1  # timed runs per (prompt, config); the median time is reported


@dataclass
class BenchOutcome:
    out_dir: Path
    markdown: str
    records: list[RunRecord]
    rows: list[report.Row]
    sweeps: list[report.SweepRow]
    files: list[Path]


def plan_from_args(args: argparse.Namespace) -> BenchPlan:
    workloads = parse_workloads(args.workload)
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {args.limit}")
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    sweep = parse_k_list(args.sweep_k) if args.sweep_k else None
    configs = verispec_configs(args.proposer, args.k, args.draft, sweep)
    peers = parse_peers(args.peers, args.k, args.draft)
    sampling = SamplingParams(temperature=args.temperature, top_p=getattr(args, "top_p", 1.0),
                              seed=args.seed,
                              max_new_tokens=args.max_new_tokens, ignore_eos=args.ignore_eos)
    repeats = getattr(args, "repeats", 1)
    if repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {repeats}")
    return BenchPlan(workloads, configs + peers.configs, sampling, args.limit, args.draft,
                     sweep, list(peers.notes), args.model, repeats)


def _peer_runner(engine, plan: BenchPlan, notes: list[str]):
    """A PeerRunner, or None when no peer is asked for; a peer that cannot run
    here leaves a note instead."""
    peers = [c for c in plan.configs if c.kind == PEER]
    if not peers:
        return None
    from verispec.bench.peers import PeerRunner

    runner = PeerRunner(engine, plan.draft, peers, plan.model)
    notes.extend(runner.notes)
    return runner


def _report_md(env: dict, plan: BenchPlan, table: str, files: list[Path]) -> str:
    lines = ["# verispec bench", "",
             f"- model: {env['model']} ({env['dtype']}, {env['device']}"
             + (f", weights {env['weights']}" if env.get("weights") else "") + ")",
             f"- machine: {env['cpu']}, {env['cores']} cores, {env['torch_threads']} torch threads"
             + (f", GPU {env['gpu']}" if env["gpu"] else ""),
             f"- torch {env['torch']}, transformers {env['transformers']}, verispec {env['verispec']}",
             f"- max_new_tokens {plan.sampling.max_new_tokens}, temperature "
             f"{plan.sampling.temperature:g}"
             + (f", top_p {plan.sampling.top_p:g}" if plan.sampling.top_p < 1 else "")
             + f", seed {plan.sampling.seed}"
             + (f", {plan.repeats} timed repeats per run (median)" if plan.repeats > 1 else ""),
             f"- command: `{env['command']}`", "", table]
    lines += [f"![{p.stem}]({p.name})" for p in files]
    return "\n".join(lines) + "\n"


def execute(engine, plan: BenchPlan, out_dir: str | Path, progress: bool = True,
            prompts: list[BenchPrompt] | None = None, peer_engine=None) -> BenchOutcome:
    """Run a plan on a loaded engine and write results.json, report.md and the
    plots to `out_dir`. `prompts` replaces the workload files (pre-tokenized)."""
    if prompts is None:
        raw = [p for name in plan.workloads for p in load_workload(name, plan.limit)]
        prompts = encode_prompts(engine, raw, plan.sampling)
    notes = list(plan.notes)
    # Peers run transformers' generate, so a native target brings an HF twin of itself.
    peers = _peer_runner(peer_engine or engine, plan, notes)
    configs = [c for c in plan.configs if c.kind != PEER or (peers is not None and peers.runs(c))]
    if any(c.kind == PEER for c in configs) and any(p.grammar is not None for p in prompts):
        notes.append("peers apply no grammar: they skip the prompts with a response_format "
                     "(the structured workload), whose speedups are then against none")
    try:
        records = run_bench(Runner(engine, plan.sampling, peers), prompts, configs, progress,
                            repeats=plan.repeats)
        if plan.sampling.greedy:
            check_equality(engine.target, prompts, records, configs, peers=peers)
        else:
            notes.append("sampling (temperature > 0): greedy-equality checks skipped")
    finally:
        if peers is not None:
            peers.close()
    rows = report.summarize(records, configs)
    sweeps = report.sweep(rows, configs) if plan.sweep else []
    broken = sum(r.vs_plain.mismatch for r in rows if r.kind != PEER)
    if broken:
        notes.append(f"{broken} verispec run(s) differ from plain greedy beyond a near-tie: "
                          "a losslessness bug (see vs_plain in results.json)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    env = environment(engine)
    settings = {"workloads": plan.workloads, "limit": plan.limit, "draft": plan.draft,
                "sweep_k": plan.sweep, "sampling": vars(plan.sampling),
                "configs": [{"label": c.label, "kind": c.kind, "name": c.name, "k": c.k,
                             "proposer": c.spec.proposer if c.spec else None, "peer": c.peer,
                             "own_reference": c.own_reference}
                            for c in configs]}
    table = report.markdown(rows, sweeps, notes)
    grammar_table = report.structured(records)
    if grammar_table:
        table += "\n" + grammar_table
    report.write_json(out / "results.json", records, rows, sweeps, env, settings, notes)
    figures = plots.draw_all(out, rows, sweeps, records)
    (out / "report.md").write_text(_report_md(env, plan, table, figures), encoding="utf-8")
    return BenchOutcome(out, table, records, rows, sweeps,
                        [out / "results.json", out / "report.md", *figures])


def _make_dir(path: str | Path, flag: str) -> Path:
    """Create an output folder before the model loads: a bad path must not cost a run."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"{flag}: cannot create {path}: {exc.strerror}") from None
    return Path(path)


def cmd_bench(args: argparse.Namespace) -> int:
    if args.concurrency or args.server:
        from verispec.serving.bench_serving import cmd_bench_serving

        return cmd_bench_serving(args)
    plan = plan_from_args(args)
    out_dir = _make_dir(args.out or Path("bench-results") / time.strftime("%Y%m%d-%H%M%S"), "--out")
    engine = engine_from(args)
    load_suffix_cache(engine, args.suffix_cache, args.suffix_max_tokens)
    peer_engine = None
    if engine.backend != "hf" and needs_hf(plan.configs):
        peer_engine = engine_from(args, backend="hf")
    outcome = execute(engine, plan, out_dir, progress=not args.no_progress,
                      peer_engine=peer_engine)
    save_suffix_cache(engine, args.suffix_cache)
    print(outcome.markdown, end="")
    print(f"verispec bench: results in {outcome.out_dir}/ "
          f"({', '.join(p.name for p in outcome.files)})", file=sys.stderr)
    return 0


def run_profile(engine, context: int = 512, max_n: int = 32, repeats: int = 5,
                draft: str | None = None, out: str | Path = "profile.json",
                plot_path: str | Path | None = None, bandwidth_mb: int | None = None):
    """Measure, write the JSON (the `economics.load_profile` format) and the plot."""
    from verispec.bench import profile as prof

    target = engine.target
    ids = prof.text_ids(engine.tokenizer, context + max_n, target.vocab_size)
    draft_model = engine.load_draft(draft) if draft else None
    result = prof.measure(target, ids, context, max_n, repeats, draft_model, draft)
    result.bandwidth = prof.measure_bandwidth(target.device, bandwidth_mb)
    result.extra = {"model": target.name, "dtype": str(target.dtype).replace("torch.", ""),
                    "device": str(target.device), "environment": environment(engine)}
    out = Path(out)
    out.write_text(json.dumps(result.to_json(), indent=1) + "\n", encoding="utf-8")
    figure = prof.plot(plot_path or out.with_suffix(".png"), result, f"{target.name}: "
                       f"T(1) = {1000 * result.t1:.2f} ms, context {context}")
    return result, out, figure


def cmd_profile(args: argparse.Namespace) -> int:
    if args.context < 1:
        raise ValueError(f"--context must be >= 1, got {args.context}")
    if args.max_n < 2:
        raise ValueError(f"--max-n must be >= 2 (a profile needs two points), got {args.max_n}")
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    for path, flag in ((args.out, "--out"), (args.plot, "--plot")):
        if path is not None:
            _make_dir(Path(path).parent, flag)
    from verispec.bench.profile import format_profile

    engine = engine_from(args)
    result, out, figure = run_profile(engine, args.context, args.max_n, args.repeats,
                                      args.draft, args.out, args.plot)
    print(format_profile(result, f"verispec profile: {engine.target.name} "
                                 f"({result.extra['dtype']}, {result.extra['device']})"))
    print(f"\nprofile written to {out} (for `verispec calc --profile`), plot to {figure}")
    return 0


def add_subcommands(subparsers: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    bench = subparsers.add_parser(
        "bench", help="benchmark proposers against plain decoding and transformers on real prompts",
        description="Run every configuration on the same chat prompts, interleaved per prompt, "
                    "and report tokens/s, speedup, acceptance, tau, the time split and a "
                    "greedy-equality check; writes results.json, report.md and plots.",
        epilog=_BENCH_EPILOG, formatter_class=fmt)
    bench.add_argument("--workload", default="all",
                       help=f"comma list of {', '.join(WORKLOADS)}, all (default), or FILE.jsonl: "
                            "your own prompts, one JSON object a line with \"prompt\" (text) or "
                            "\"messages\" (a chat), and optionally \"id\"")
    bench.add_argument("--proposer", default="none,ngram",
                       help="comma list: none, ngram, self:L, draft, or a registered name, "
                            "each with optional +tree=N (token tree), +auto (adaptive k) or, "
                            "for eagle and medusa, +head=DIR (a trained head other than the "
                            "shipped one), e.g. ngram+tree=16,ngram+auto,eagle+head=runs/eagle; "
                            "a token ending in +prediction sends each prompt's predicted output "
                            "(the predicted-edit workload's), which drafts first "
                            "(default none,ngram)")
    bench.add_argument("--k", type=int, default=4, help="draft tokens per target pass (default 4)")
    bench.add_argument("--sweep-k", default=None, metavar="RANGE",
                       help="also run each speculative proposer at every k: 1..10 or 1,2,4,8 "
                            "(replaces --k for them)")
    bench.add_argument("--peers", default="hf-plain",
                       help="comma list of hf-plain, hf-static, hf-pld, hf-assisted, "
                            "llamaserver-plain, llamaserver-ngram-mod, "
                            "llamaserver-ngram-simple, llamaserver-ngram-map-k, "
                            "llamaserver-ngram-map-k4v, llamaserver-ngram-cache, "
                            "llamaserver-draft (llama-server over HTTP), or none "
                            "(default hf-plain)")
    bench.add_argument("--draft", default=None, metavar="PATH",
                       help="draft model for proposer 'draft' and hf-assisted (a path, or self:L); "
                            "llamaserver-draft needs a .gguf with the target's vocabulary")
    bench.add_argument("--max-new-tokens", type=int, default=128,
                       help="cap on generated tokens per prompt (default 128)")
    bench.add_argument("--limit", type=int, default=None, metavar="N",
                       help="first N prompts of each workload (default: all of them)")
    bench.add_argument("--temperature", type=float, default=0.0,
                       help="0 = greedy (default), which makes outputs comparable")
    bench.add_argument("--top-p", type=float, default=1.0,
                       help="with --temperature > 0: nucleus sampling's mass (default 1.0, off)")
    bench.add_argument("--seed", type=int, default=0, help="sampling seed, same for every run (default 0)")
    bench.add_argument("--ignore-eos", action="store_true",
                       help="always generate --max-new-tokens tokens (fixed-length runs)")
    bench.add_argument("--out", default=None, metavar="DIR",
                       help="results directory (default bench-results/<timestamp>)")
    add_suffix_cache_arg(bench)
    bench.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    bench.add_argument("--concurrency", default=None, metavar="LIST",
                       help="serving benchmark: concurrent streams per level, e.g. 1,2,4,8,16; "
                            "throughput and latency of none, fixed --k and adaptive k "
                            "(first proposer of --proposer) through an in-process server")
    bench.add_argument("--server", default=None, metavar="URL",
                       help="serving benchmark against a running `verispec serve` at URL")
    bench.add_argument("--duration", type=float, default=20.0,
                       help="serving benchmark: seconds per mode and level (default 20)")
    bench.add_argument("--repeats", type=int, default=1,
                       help="time every (prompt, config) this many times, interleaved, and "
                            "report the median: ratios then survive a noisy machine (default 1)")
    bench.add_argument("--rounds", type=int, default=1,
                       help="serving benchmark: repeat every level's mode rotation this many "
                            "times and report medians; the machine's drift then hits all "
                            "modes alike (default 1)")
    bench.add_argument("--control", action="store_true",
                       help="serving benchmark: add a second `none` mode, whose ratio to the "
                            "first (an A/A comparison) shows this run's noise band")
    add_model_args(bench)
    bench.set_defaults(func=cmd_bench)

    prof = subparsers.add_parser(
        "profile", help="measure T(n)/T(1), the cost of verifying n positions in one forward",
        description="Time one target forward over n = 1..max-n new positions after a real "
                    "context, the draft's cost per token and the memory-bandwidth bound; write "
                    "the cost profile that `verispec calc/simulate --profile` read.",
        epilog=_PROFILE_EPILOG, formatter_class=fmt)
    prof.add_argument("--context", type=int, default=512,
                      help="tokens of real text already in the cache (default 512)")
    prof.add_argument("--max-n", type=int, default=32, help="largest n measured (default 32)")
    prof.add_argument("--repeats", type=int, default=5,
                      help="timings per n; the median is kept (default 5)")
    prof.add_argument("--draft", default=None, metavar="PATH|self:L",
                      help="also measure this draft's 1-token forward, relative to T(1)")
    prof.add_argument("--out", default="profile.json", metavar="FILE",
                      help="profile JSON for `verispec calc --profile` (default profile.json)")
    prof.add_argument("--plot", default=None, metavar="FILE.png",
                      help="plot of T(n)/T(1) (default: --out with .png)")
    add_model_args(prof)
    prof.set_defaults(func=cmd_profile)
