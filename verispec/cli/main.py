"""`verispec` command line: a thin adapter over the Python API.

Every user error (bad flag, bad value, missing model) exits with code 2 and a
one-line message; a traceback means a bug in verispec.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Callable

from verispec.cli.args import (
    CliError,
    add_model_args,
    add_sampling_args,
    add_spec_args,
    engine_from,
    load_suffix_cache,
    sampling_from,
    save_suffix_cache,
    spec_from,
)

EPILOG = """examples:
  verispec generate --prompt "Summarize: ..." --chat
  verispec generate --prompt-file doc.txt --proposer ngram --k 6 --json
  verispec generate --prompt "Once upon a time" --proposer self:12
  verispec generate --prompt "Once upon a time" --proposer eagle --tree 16
  verispec generate --chat --prompt-file edit_request.txt --prediction-file original.py
  verispec calc --alpha 0.8 --k 4 --verify-overhead 0.1
"""


def _read_prompt(args) -> str:
    if args.prompt is not None and args.prompt_file is not None:
        raise CliError("give --prompt or --prompt-file, not both")
    if args.prompt_file == "-":
        return sys.stdin.read()
    if args.prompt_file is not None:
        try:
            with open(args.prompt_file, encoding="utf-8") as fh:
                return fh.read()
        except OSError as exc:
            raise CliError(f"cannot read --prompt-file: {exc.strerror}: {args.prompt_file}")
    if args.prompt is None:
        raise CliError("give a prompt with --prompt TEXT or --prompt-file FILE (- for stdin)")
    return args.prompt


def _read_prediction(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError as exc:
        raise CliError(f"cannot read --prediction-file: {exc.strerror}: {path}")


def cmd_generate(args) -> int:
    prompt = _read_prompt(args)
    prediction = _read_prediction(args.prediction_file)
    sampling, spec = sampling_from(args), spec_from(args)
    engine = engine_from(args)
    load_suffix_cache(engine, args.suffix_cache, args.suffix_max_tokens)
    if args.json:
        result = engine.generate(prompt, sampling, spec, chat=args.chat, prediction=prediction)
        print(json.dumps(result.to_dict(), ensure_ascii=False))
        save_suffix_cache(engine, args.suffix_cache)
        return 0
    stats = None
    for chunk in engine.stream(prompt, sampling, spec, chat=args.chat, prediction=prediction):
        sys.stdout.write(chunk.text)
        sys.stdout.flush()
        stats = chunk.stats
    sys.stdout.write("\n")
    print(stats.format_line(), file=sys.stderr if args.stats_to_stderr else sys.stdout)
    save_suffix_cache(engine, args.suffix_cache)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="verispec", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Lossless speculative decoding: a cheap proposer guesses k tokens, the "
                    "target checks them in one forward pass, and the output is exactly what "
                    "the target alone would produce.", epilog=EPILOG)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    gen = sub.add_parser(
        "generate", help="generate text with speculative decoding",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Generate from a prompt and print the text, then one stats line: proposer, "
                    "k, drafted, accepted, acceptance rate, tau (tokens per target forward), "
                    "target forwards, tokens/s and the time split.", epilog=EPILOG)
    gen.add_argument("--prompt", help="the prompt text")
    gen.add_argument("--prompt-file", help="read the prompt from a file, - for stdin")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    gen.add_argument("--prediction-file", metavar="F",
                     help="a predicted output (OpenAI's Predicted Outputs): text the answer will "
                          "mostly repeat, such as the file being edited; it drafts first, "
                          "aligned to the output as it grows, the --proposer drafts where it has "
                          "nothing to offer; the output is unchanged, the stats line counts its "
                          "accepted and rejected tokens (docs/predicted_outputs.md)")
    gen.add_argument("--json", action="store_true",
                     help="print one JSON object: text, token_ids, finish_reason, stats")
    gen.add_argument("--stats-to-stderr", action="store_true",
                     help="print the stats line on stderr, keeping stdout for the text")
    add_model_args(gen)
    add_spec_args(gen)
    add_sampling_args(gen)
    gen.set_defaults(func=cmd_generate)

    from verispec.bench.econ_cli import add_subcommands as add_econ

    add_econ(sub)
    from verispec.bench.bench_cli import add_subcommands as add_bench
    add_bench(sub)
    from verispec.training.cli import add_subcommands as add_training
    add_training(sub)
    from verispec.training.warm_suffix import add_subcommands as add_warm_suffix
    add_warm_suffix(sub)
    from verispec.serving.cli import add_subcommands as add_serve
    add_serve(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except (CliError, ValueError) as exc:
        print(f"verispec {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
