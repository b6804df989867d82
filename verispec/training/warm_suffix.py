"""`verispec warm-suffix`: fill a suffix cache with the target's answers to many requests.

Suffix decoding drafts what the target wrote before (verispec.proposers.suffix), so its
global store pays only once it holds answers. A server's store fills as traffic passes;
this command fills one ahead of time: the target answers a prompt file (a log of past
requests, say) or prompts built from this machine's installed material (never a bench
prompt: verispec.training.material), and every answer goes into the `--suffix-cache` file
that `generate`, `bench` and `serve` load. The answers are the target's own output, greedy
for most prompts and sampled for a seeded share, which is what the store would have
learned by serving the same requests. Where the backend fuses batches the prompts are
decoded `--batch` at a time (verispec.training.responses).
"""
from __future__ import annotations

import argparse
import sys

EPILOG = """examples:
  verispec warm-suffix --prompts traffic.jsonl --suffix-cache store.npz
  verispec warm-suffix --material 3000 --kinds chat,creative --tokens 600000 \\
      --suffix-cache store.npz --suffix-max-tokens 1000000
  verispec bench --workload chat --proposer none,suffix+auto --suffix-cache store.npz \\
      --suffix-max-tokens 1000000

A prompt file holds one JSON object a line, with "prompt" (text) or "messages" (a chat),
as `verispec bench --workload FILE.jsonl` reads it. An existing cache is loaded first and
the new answers are added after its own (the oldest are evicted past the store's bounds).
Ctrl-C saves the answers finished so far.
"""


def add_subcommands(sub) -> None:
    from verispec.cli.args import add_model_args, add_suffix_cache_arg, positive_int

    p = sub.add_parser("warm-suffix", help="fill a --suffix-cache file with the target's "
                                           "answers to many requests",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Have the target answer a prompt file, or prompts built "
                                   "from installed material, and store the answers as a "
                                   "suffix cache that suffix decoding drafts from.",
                       epilog=EPILOG)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompts", metavar="FILE.jsonl",
                        help="the requests to answer, one JSON object a line")
    source.add_argument("--material", type=positive_int, metavar="N",
                        help="build N prompts from installed docs, code and word lists "
                             "(the head-training material; never a bench prompt)")
    p.add_argument("--kinds", default="all",
                   help="with --material: comma list of chat, creative, summarize, "
                        "code-edit, code, or all (default)")
    p.add_argument("--tokens", type=positive_int, default=200_000,
                   help="stop taking prompts once the answers hold this many tokens; answers "
                        "in flight finish (default 200000)")
    p.add_argument("--max-new-tokens", type=positive_int, default=256,
                   help="cap per answer (default 256)")
    p.add_argument("--sampled-share", type=float, default=0.25,
                   help="share of prompts answered by sampling instead of greedily, chosen "
                        "per prompt from --seed (default 0.25)")
    p.add_argument("--temperature", type=float, default=0.8,
                   help="temperature of the sampled share (default 0.8)")
    p.add_argument("--batch", type=positive_int, default=32,
                   help="answers decoded together where the backend fuses batches (default 32)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0,
                   help="torch CPU threads; 0 = torch's default")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_model_args(p)
    add_suffix_cache_arg(p)
    p.set_defaults(func=cmd_warm_suffix)


def _check(args) -> None:
    from verispec.cli.args import CliError
    from verispec.training.material import KINDS

    if not args.suffix_cache:
        raise CliError("warm-suffix needs --suffix-cache FILE: where the answers are stored")
    if not 0.0 <= args.sampled_share <= 1.0 or args.temperature <= 0:
        raise CliError("--sampled-share is a share in [0, 1] and --temperature must be > 0")
    kinds = args.kinds.split(",")
    if args.kinds != "all" and not set(kinds) <= set(KINDS):
        raise CliError(f"--kinds: unknown kind in {args.kinds!r}; choose from "
                       f"{', '.join(KINDS)} or all")


def _prompts(args, engine) -> list:
    """The requests as token ids, in the order they are answered."""
    from verispec.cli.args import CliError

    if args.prompts is not None:
        from verispec.bench.workloads import load_workload

        try:
            loaded = load_workload(args.prompts)
        except (OSError, ValueError) as exc:
            raise CliError(f"--prompts: {exc}") from None
        from verispec.training.responses import PromptIds

        return [PromptIds(p.id, p.workload, engine.encode_messages(list(p.messages)))
                for p in loaded]
    from verispec.training.cli import encode_prompts
    from verispec.training.material import build_prompts

    kinds = None if args.kinds == "all" else set(args.kinds.split(","))
    built = [p for p in build_prompts(args.material, args.seed)
             if kinds is None or p.kind in kinds]
    return encode_prompts(engine.tokenizer, built)


def cmd_warm_suffix(args) -> int:
    import torch
    from tqdm.auto import tqdm

    from verispec.cli.args import engine_from, load_suffix_cache, save_suffix_cache
    from verispec.training.responses import GenerationSettings, decode_prompts

    _check(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    engine = engine_from(args)
    load_suffix_cache(engine, args.suffix_cache, args.suffix_max_tokens)
    prompts = _prompts(args, engine)
    limit = engine.target.max_context - 1
    fits = [p for p in prompts if len(p.tokens) < limit]
    if len(fits) < len(prompts):
        print(f"verispec: warm-suffix: {len(prompts) - len(fits)} prompts longer than the "
              f"model's context skipped", file=sys.stderr)
    settings = GenerationSettings(max_new_tokens=args.max_new_tokens, token_budget=args.tokens,
                                  sample_fraction=args.sampled_share,
                                  temperature=args.temperature, seed=args.seed,
                                  batch_size=args.batch)
    answers = tokens = 0
    store = engine.suffix_store
    with tqdm(total=args.tokens, desc="answers", unit="tok", dynamic_ncols=True,
              disable=args.no_progress, file=sys.stderr) as bar:
        try:
            for _, _, response in decode_prompts(engine.target, iter(fits), settings,
                                                 lambda: tokens >= args.tokens):
                store.add(response)
                answers, tokens = answers + 1, tokens + len(response)
                bar.update(len(response))
        except KeyboardInterrupt:
            print("\nverispec: warm-suffix interrupted: saving the answers so far",
                  file=sys.stderr)
    print(f"verispec: warm-suffix: {answers} answers, {tokens} tokens, from "
          f"{len(fits)} prompts", file=sys.stderr)
    save_suffix_cache(engine, args.suffix_cache)
    return 0
