"""The flags that several commands share (model, speculation, sampling) and the
functions that turn them into an `Engine`, a `SpecConfig` and `SamplingParams`.

`verispec generate`, `serve`, `bench` and `profile` all add their flags from
here, so one flag means one thing everywhere; speculation text goes through
`verispec.spec_text`, the one parser of what users type about it.
"""
from __future__ import annotations

import argparse

from verispec.config import (
    HEAD_QUANTS,
    SUFFIX_STORE_REQUESTS,
    SUFFIX_STORE_TOKENS,
    TREE_SHAPES,
    SamplingParams,
    SpecConfig,
)
from verispec.spec_text import (
    DRAFT_SOURCES,
    SpecError,
    draft_source,
    parse_spec,
    proposer_names,
)

# verispec's short names and torch's own spellings; models.loading reads both.
DTYPES = ("auto", "bf16", "bfloat16", "fp32", "float32", "fp16", "float16")


class CliError(Exception):
    """A user error: printed as one line, exit code 2."""


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default",
                   help="a local HF model directory or a .gguf file "
                        "(default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", default="auto", choices=DTYPES, metavar="{auto,bf16,fp32,fp16}",
                   help="auto = bf16 on CUDA or CPUs with AMX/AVX512-BF16 (fp32 for --backend hf "
                        "on CPU), else fp32; torch's names (bfloat16, float32, float16) work too")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 ... (default: cuda if present)")
    p.add_argument("--backend", default="auto", choices=["auto", "native", "hf"],
                   help="native = verispec's fast Llama-family forward; hf = transformers "
                        "(any model); auto = native where supported")
    p.add_argument("--weights", default="auto", choices=["auto", "quant", "quant-i8", "dense"],
                   help="GGUF files: quant-i8 = run the file's quantized blocks in verispec's "
                        "kernels with activations rounded to int8, as llama.cpp does (needs "
                        "AVX-512-VNNI or AVX-VNNI; the logits differ from dense bf16 by that rounding, and "
                        "speculation stays bit-exact against plain decoding on the same path); "
                        "quant = the blocks dequantized exactly to bf16 in the kernels (the dense "
                        "logits bit for bit, slower); dense = dequantize to bf16 once (a cached "
                        "copy); auto = quant-i8 where the CPU has VNNI, else quant where the "
                        "kernels build, else dense. The stats line says which ran (weights=...; "
                        "quant-i8/avx-vnni: the 256-bit kernels of CPUs without AVX-512)")
    p.add_argument("--batch-invariant", action="store_true",
                   help="native only: every position's logits are bit-identical whether "
                        "computed alone, in a verification block or in a batch. Always on, at no "
                        "cost, for bf16 on verispec's CPU kernels (AMX or AVX-512-BF16); this flag extends it to "
                        "fp32 (matmuls on fixed 8-row tiles, slower) and to CPUs without the kernels")


def engine_from(args: argparse.Namespace, backend: str | None = None):
    """The Engine that a command's model flags (`add_model_args`) describe. `backend`:
    another backend than the flags' (the transformers peer of a benchmark), which
    then loads without --batch-invariant (a native-only setting)."""
    from verispec.api import Engine

    return Engine(args.model, dtype=args.dtype, device=args.device,
                  backend=backend or args.backend,
                  batch_invariant=args.batch_invariant and backend is None,
                  weights=args.weights if backend is None else "dense")


def proposer_arg(text: str) -> str:
    """argparse type of --proposer: a registered name or a draft source (self:L)."""
    if text in proposer_names():
        return text
    try:
        if draft_source(text):
            return text
    except SpecError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    sources = ", ".join(f"{p}:..." for p in DRAFT_SOURCES)
    raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from "
                                     f"{', '.join(proposer_names())} or {sources})")


def add_spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--proposer", default="ngram", type=proposer_arg,
                   help="who guesses the next tokens: ngram (prompt lookup, free), "
                        "suffix (what followed the context's suffix in earlier outputs of this "
                        "engine and in this request, counted; see --suffix-cache), "
                        "lookahead (Jacobi iterations on guesses in the verify forward feed an "
                        "n-gram pool; see --lookahead-window), "
                        "draft (a small model or self:L), self:L (short for --proposer draft "
                        "--draft self:L), eagle / medusa (trained heads on the "
                        "target's hidden states), auto (each step ngram or suffix, whichever "
                        "matched the longer suffix), none (plain decoding)")
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
    p.add_argument("--tree", default="0", metavar="N",
                   help="node budget of a token tree verified in one pass (ngram: one branch "
                        "per distinct match); 0 = a chain of k tokens")
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
    p.add_argument("--head-quant", default=None, choices=HEAD_QUANTS,
                   help="eagle: run the head's matrices in these GGUF blocks (fewer bytes per "
                        "draft step; drafts change a little, the output never does); "
                        "default: as trained, bf16")
    p.add_argument("--suffix-factor", type=float, default=SpecConfig.suffix_factor,
                   help="suffix: after a match of m tokens, draft at most factor * m + "
                        "--suffix-offset tokens (default 1.0)")
    p.add_argument("--suffix-offset", type=float, default=SpecConfig.suffix_offset,
                   help="suffix: added to the draft-length cap (default 0)")
    p.add_argument("--suffix-min-prob", type=float, default=SpecConfig.suffix_min_prob,
                   help="suffix: extend a draft path while the share of past occurrences that "
                        "follow it stays at least this (default 0.1)")
    add_suffix_cache_arg(p)
    p.add_argument("--lookahead-window", type=int, default=SpecConfig.lookahead_window,
                   metavar="W", help="lookahead: Jacobi columns of the window (default %(default)s)")
    p.add_argument("--lookahead-ngram", type=int, default=SpecConfig.lookahead_ngram,
                   metavar="N", help="lookahead: n-gram length; the window keeps N - 1 levels "
                                     "(default %(default)s)")
    p.add_argument("--lookahead-guesses", type=int, default=SpecConfig.lookahead_guesses,
                   metavar="G", help="lookahead: pool n-grams verified per step (default "
                                     "%(default)s); a step feeds (W + G) * (N - 1) tree nodes, "
                                     "capped by --tree")
    p.add_argument("--frequency-drafts", action="store_true",
                   help="sampling only, ngram and suffix chains: draw each draft token from how "
                        "often each continuation followed before (sharpened by --temperature) and "
                        "verify against those probabilities, instead of proposing the likeliest; "
                        "lossless (docs/sampling.md)")
    p.add_argument("--lossy-typical", action="store_true",
                   help="sampling only: Medusa's typical acceptance instead of rejection sampling; "
                        "LOSSY (output no longer follows the model), marked so in the stats")


def add_suffix_cache_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suffix-cache", default=None, metavar="FILE",
                   help="load the outputs that --proposer suffix (and auto) draft from at start, "
                        "and save them with this run's at the end, so repeated runs learn; a "
                        "missing file starts empty, an unreadable one is reported and replaced")
    p.add_argument("--suffix-max-tokens", type=positive_int, default=None, metavar="N",
                   help="the store's bound in cached tokens, oldest outputs evicted first "
                        f"(default {SUFFIX_STORE_TOKENS}; its memory: docs/suffix.md); "
                        "a store filled by `verispec warm-suffix` may want more")


def positive_int(text: str) -> int:
    """argparse type of a count that must be at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def load_suffix_cache(engine, path: str | None, max_tokens: int | None = None) -> None:
    """Fill engine.suffix_store from `path`. A missing file is a first run; an
    unusable one gets a one-line warning and the run goes on with an empty store.
    `max_tokens` (--suffix-max-tokens): the store gets that bound first, and a request
    bound that lets outputs of 32 tokens or more reach it."""
    import sys

    from verispec.proposers.suffix_store import SuffixCacheError, SuffixStore

    if max_tokens is not None:
        engine.suffix_store = SuffixStore(max(SUFFIX_STORE_REQUESTS, max_tokens // 32), max_tokens)
    if not path:
        return
    try:
        count = engine.suffix_store.load(path, engine.target.vocab_size)
    except FileNotFoundError:
        return
    except SuffixCacheError as exc:
        print(f"verispec: warning: --suffix-cache: {exc}; starting with an empty store "
              f"(the file is rewritten at the end)", file=sys.stderr)
        return
    print(f"verispec: --suffix-cache {path}: {count} cached outputs", file=sys.stderr)


def save_suffix_cache(engine, path: str | None) -> None:
    if not path:
        return
    import sys

    try:
        engine.suffix_store.save(path)
    except OSError as exc:
        raise CliError(f"cannot write --suffix-cache {path}: {exc.strerror}") from None
    stats = engine.suffix_store.stats()
    print(f"verispec: --suffix-cache {path}: saved {stats.requests} outputs, {stats.tokens} "
          f"tokens (store memory {stats.memory_bytes / 2**20:.1f} MiB)", file=sys.stderr)


def spec_from(args: argparse.Namespace) -> SpecConfig:
    """The SpecConfig that the flags of `add_spec_args` describe."""
    head_vocab = SpecConfig.head_vocab if args.head_vocab is None else args.head_vocab
    return parse_spec(proposer=args.proposer, k=args.k, k_max=args.k_max, draft=args.draft,
                      tree=args.tree, tree_shape=args.tree_shape,
                      tree_branch=args.tree_branch, profile=args.profile,
                      ngram_min=args.ngram_min, ngram_max=args.ngram_max, head=args.head,
                      head_vocab=head_vocab, head_quant=args.head_quant,
                      lossy_typical=args.lossy_typical,
                      suffix_factor=args.suffix_factor, suffix_offset=args.suffix_offset,
                      suffix_min_prob=args.suffix_min_prob,
                      lookahead_window=args.lookahead_window, lookahead_ngram=args.lookahead_ngram,
                      lookahead_guesses=args.lookahead_guesses,
                      frequency_drafts=getattr(args, "frequency_drafts", False))


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k likeliest tokens; 0 = off")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus mass in (0, 1]; 1 = off")
    p.add_argument("--seed", type=int, default=None, help="seed of the request's sampler")
    p.add_argument("--max-new-tokens", type=int, default=128, help="cap on generated tokens")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop string (repeatable); the output ends before it")
    p.add_argument("--ignore-eos", action="store_true", help="keep going past EOS")


def sampling_from(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                          seed=args.seed, max_new_tokens=args.max_new_tokens,
                          stop=tuple(args.stop), ignore_eos=args.ignore_eos)
