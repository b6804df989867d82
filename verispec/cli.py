"""`verispec` command line: a thin adapter over the Python API.

Every user error (bad flag, bad value, missing model) exits with code 2 and a
one-line message; a traceback means a bug in verispec.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Callable

EPILOG = """examples:
  verispec generate --prompt "Summarize: ..." --chat
  verispec generate --prompt-file doc.txt --proposer ngram --k 6 --json
  verispec generate --prompt "Once upon a time" --proposer draft --draft self:12
  verispec calc --alpha 0.8 --k 4 --verify-overhead 0.1
"""


class CliError(Exception):
    """A user error: printed as one line, exit code 2."""


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default",
                   help="a local HF model directory or a .gguf file "
                        "(default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32", "fp16"],
                   help="auto = bf16 on CUDA or CPUs with AMX/AVX512-BF16 (fp32 for --backend hf on CPU), else fp32")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 ... (default: cuda if present)")
    p.add_argument("--backend", default="auto", choices=["auto", "native", "hf"],
                   help="native = verispec's fast Llama-family forward; hf = transformers "
                        "(any model); auto = native where supported")
    p.add_argument("--weights", default="auto", choices=["auto", "quant", "dense"],
                   help="GGUF files: quant = run the file's quantized blocks in verispec's "
                        "kernels (memory about the file's size, same logits as dense); dense = "
                        "dequantize to bf16 once (a cached copy); auto = quant where the "
                        "kernels build")
    p.add_argument("--batch-invariant", action="store_true",
                   help="native only: every position's logits are bit-identical whether "
                        "computed alone, in a verification block or in a batch. Always on, at no "
                        "cost, for bf16 on verispec's CPU kernels (AMX); this flag extends it to "
                        "fp32 (matmuls on fixed 8-row tiles, slower) and to CPUs without the kernels")


def add_spec_args(p: argparse.ArgumentParser) -> None:
    from .config import TREE_SHAPES
    from .proposers import available

    p.add_argument("--proposer", default="ngram", choices=available(),
                   help="who guesses the next tokens: ngram (prompt lookup, free), "
                        "draft (a small model or self:L), eagle / medusa (trained heads on the "
                        "target's hidden states), auto (each step the candidate that pays best, "
                        "keyed on n-gram lookup's match length: ngram, the shipped heads, the "
                        "--draft model if given, or none), none (plain decoding)")
    p.add_argument("--k", default="auto",
                   help="draft tokens per target pass; 0 = plain decoding; auto (default) = "
                        "choose k each step to maximize tokens/s, capped by --k-max")
    p.add_argument("--k-max", type=int, default=8, help="largest k that --k auto may choose")
    p.add_argument("--profile", default=None,
                   help="cost profile from `verispec profile`, a prior for --k auto")
    p.add_argument("--draft", default=None,
                   help="for --proposer draft: a model path, self:L to reuse the "
                        "target's first L layers (no extra weights), or quant:Q4_0[:L] for the "
                        "target's own layers cast at load to Q4_0 (or Q4_1, Q5_0, Q5_1, Q8_0), "
                        "optionally only the first L, run by verispec's kernels")
    p.add_argument("--tree", default="0", metavar="N|auto",
                   help="node budget of a token tree verified in one pass (ngram: one branch "
                        "per distinct match); 0 = a chain of k tokens; auto = choose the "
                        "budget (up to --tree-max) and the depth per step from measured "
                        "acceptance and step times (k becomes adaptive too, capped by a numeric "
                        "--k, or by --k-max with --k auto)")
    p.add_argument("--tree-max", type=int, default=32,
                   help="with --tree auto: the largest node budget considered (default 32)")
    p.add_argument("--tree-shape", default="dynamic", choices=TREE_SHAPES,
                   help="with --tree, for draft / eagle / medusa: dynamic = EAGLE-2's tree, "
                        "growing the branches with the highest cumulative draft probability and "
                        "keeping the --tree likeliest nodes; topb = a static tree, every node's "
                        "--tree-branch likeliest children, breadth-first up to --tree nodes. "
                        "Depth is at most --k either way")
    p.add_argument("--tree-branch", type=int, default=4,
                   help="with --tree: children per expanded node (dynamic also expands this many "
                        "nodes per depth); ngram ignores it")
    p.add_argument("--ngram-min", type=int, default=1, help="shortest suffix n-gram to look up")
    p.add_argument("--ngram-max", type=int, default=4, help="longest suffix n-gram, tried first")
    p.add_argument("--head", default=None,
                   help="for --proposer eagle|medusa: a head directory from `verispec train-head` "
                        "(default: the head shipped for the default model)")
    p.add_argument("--head-vocab", type=int, default=None,
                   help="heads draft over at most this many tokens, the lowest ids of the head's "
                        "draft vocabulary (frequent first in BPE); a smaller LM-head product per "
                        "draft token; 0 = all of it (default: SpecConfig.head_vocab, 8192)")
    p.add_argument("--lossy-typical", action="store_true",
                   help="sampling only: Medusa's typical acceptance instead of rejection sampling; "
                        "LOSSY (output no longer follows the model), marked so in the stats")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k likeliest tokens; 0 = off")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus mass in (0, 1]; 1 = off")
    p.add_argument("--seed", type=int, default=None, help="seed of the request's sampler")
    p.add_argument("--max-new-tokens", type=int, default=128, help="cap on generated tokens")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop string (repeatable); the output ends before it")
    p.add_argument("--ignore-eos", action="store_true", help="keep going past EOS")


def sampling_from(args):
    from .config import SamplingParams

    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                          seed=args.seed, max_new_tokens=args.max_new_tokens,
                          stop=tuple(args.stop), ignore_eos=args.ignore_eos)


def spec_from(args):
    from .config import SpecConfig

    tree_auto = str(args.tree) == "auto"
    adaptive = str(args.k) == "auto" or tree_auto
    try:
        k = args.k_max if adaptive and str(args.k) == "auto" else int(args.k)
    except ValueError:
        raise CliError(f"--k takes a whole number or auto, got {args.k!r}") from None
    try:
        tree = args.tree_max if tree_auto else int(args.tree)
    except ValueError:
        raise CliError(f"--tree takes a whole number or auto, got {args.tree!r}") from None
    head_vocab = SpecConfig.head_vocab if args.head_vocab is None else args.head_vocab
    return SpecConfig(proposer=args.proposer, k=k, draft=args.draft, adaptive=adaptive, tree=tree,
                      tree_auto=tree_auto,
                      tree_shape=args.tree_shape, tree_branch=args.tree_branch,
                      profile=args.profile, ngram_min=args.ngram_min, ngram_max=args.ngram_max,
                      head=args.head, head_vocab=head_vocab, lossy_typical=args.lossy_typical)


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


def cmd_generate(args) -> int:
    prompt = _read_prompt(args)
    sampling, spec = sampling_from(args), spec_from(args)
    from .api import Engine

    engine = Engine(args.model, dtype=args.dtype, device=args.device, backend=args.backend,
                    batch_invariant=args.batch_invariant, weights=args.weights)
    if args.json:
        result = engine.generate(prompt, sampling, spec, chat=args.chat)
        print(json.dumps(result.to_dict(), ensure_ascii=False))
        return 0
    stats = None
    for chunk in engine.stream(prompt, sampling, spec, chat=args.chat):
        sys.stdout.write(chunk.text)
        sys.stdout.flush()
        stats = chunk.stats
    sys.stdout.write("\n")
    print(stats.format_line(), file=sys.stderr if args.stats_to_stderr else sys.stdout)
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
    gen.add_argument("--json", action="store_true",
                     help="print one JSON object: text, token_ids, finish_reason, stats")
    gen.add_argument("--stats-to-stderr", action="store_true",
                     help="print the stats line on stderr, keeping stdout for the text")
    add_model_args(gen)
    add_spec_args(gen)
    add_sampling_args(gen)
    gen.set_defaults(func=cmd_generate)

    from .bench.econ_cli import add_subcommands as add_econ

    add_econ(sub)
    from .bench.bench_cli import add_subcommands as add_bench
    add_bench(sub)
    from .training.cli import add_subcommands as add_training
    add_training(sub)
    from .serving.cli import add_subcommands as add_serve
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
