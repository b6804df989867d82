"""`verispec train-head`: train an EAGLE or Medusa head for a target on CPU."""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

EPILOG = """examples:
  verispec train-head --type eagle --target default --out runs/eagle --tokens 100000 --steps 500
  verispec train-head --type medusa --target default --out runs/medusa --data runs/eagle/data
  verispec train-head ... --resume        # continue an interrupted run from its checkpoint
  verispec train-head --type eagle --out runs/ft --init verispec/proposers/heads/shipped/eagle-smollm2-135m \
      --seed 1 --steps 300 --lr 2e-4       # fine-tune a head on new responses
  verispec train-head --type eagle --out runs/own --self-prompts 1 --extra-data runs/eagle/data
      # the target writes its own requests (Magpie); train on those and an older cache

Phases: the target answers prompts built from installed material (responses,
cached in DIR/data), one teacher-forced pass records its hidden states and
top-k probabilities (features, cached), then the head trains (checkpoints in
DIR). The head is DIR/config.json + DIR/head.safetensors; use it with
`verispec generate --proposer eagle --head DIR`.
"""


def add_subcommands(sub) -> None:
    p = sub.add_parser("train-head", help="train an EAGLE or Medusa draft head for a target",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Train a draft head on the target's own responses and "
                                   "hidden states.", epilog=EPILOG)
    p.add_argument("--type", required=True, choices=["eagle", "medusa"], dest="head_type")
    p.add_argument("--target", default="default", help="the target model (default: the embedded one)")
    p.add_argument("--out", required=True, help="output directory: head, checkpoint, loss curve, data")
    p.add_argument("--tokens", type=int, default=100_000,
                   help="response tokens the target generates for training (default 100000)")
    p.add_argument("--steps", type=int, default=500, help="optimizer steps (default 500)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true", help="continue from DIR/checkpoint.pt")
    p.add_argument("--data", default=None, help="where responses and features are cached "
                                                "(default DIR/data; share it between head types)")
    p.add_argument("--export", default=None, help="also copy the finished head files here")
    p.add_argument("--extra-data", nargs="+", default=[], metavar="DIR",
                   help="also train on the responses cached in these data dirs (other runs' "
                        "--data, same target weights); features for this head's layers are "
                        "computed there once if missing")
    p.add_argument("--self-prompts", type=float, default=0.0, metavar="SHARE",
                   help="share (0-1) of training prompts the target writes itself, Magpie style: "
                        "far more varied than the installed material; 0 = none (default)")
    p.add_argument("--init", default=None,
                   help="start from this head's weights and draft vocabulary, e.g. to fine-tune "
                        "a shipped head on new data (same --type and shape)")
    p.add_argument("--fused", action="store_true",
                   help="eagle: read low, middle and high target layers (EAGLE-3 style)")
    p.add_argument("--draft-vocab", type=int, default=0,
                   help="draft over the N most frequent tokens only (cheaper LM head); 0 = all")
    p.add_argument("--medusa-heads", type=int, default=4, help="medusa: draft positions per pass")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per step")
    p.add_argument("--max-len", type=int, default=512, help="positions per training sequence")
    p.add_argument("--lr", type=float, default=None,
                   help="peak learning rate (default: eagle 5e-4, medusa 1e-3 as in the Medusa paper)")
    p.add_argument("--unroll", type=int, default=3, help="eagle: draft steps unrolled in training")
    p.add_argument("--max-new-tokens", type=int, default=200, help="cap per generated response")
    p.add_argument("--batch", type=int, default=32,
                   help="responses decoded together when the backend batches requests")
    p.add_argument("--dtype", default="auto", choices=["auto", "bf16", "bfloat16", "fp32", "float32"],
                   help="the target's dtype; heads run in the dtype of the target they draft for")
    p.add_argument("--backend", default="auto", choices=["auto", "native", "hf"])
    p.add_argument("--threads", type=int, default=0,
                   help="torch CPU threads; 0 = torch's default (all cores). On a machine shared "
                        "with other work, 1 avoids threads spinning on busy cores")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_train_head)


def _other_fingerprints(source: str, backend: str, loaded_dtype) -> list[str]:
    """The target's weight hash in the dtypes it was not loaded in: the hash samples
    the loaded tensors, and a head serves the same weights in bf16 and fp32 alike."""
    import torch

    from verispec.models.loading import load_target

    found = []
    for dtype in ("bf16", "fp32"):
        wanted = torch.bfloat16 if dtype == "bf16" else torch.float32
        if wanted != loaded_dtype:
            other = load_target(source, backend=backend, dtype=dtype).target
            found.append(other.weights_fingerprint())
    return found


def encode_prompts(tokenizer, prompts) -> list:
    from verispec.prompt_ids import chat_ids, text_ids
    from verispec.training.responses import PromptIds

    out = []
    for p in prompts:
        if getattr(tokenizer, "chat_template", None):
            ids = chat_ids(tokenizer, p.messages)
        else:
            ids = text_ids(tokenizer, p.messages[-1]["content"])
        out.append(PromptIds(p.id, p.kind, ids))
    return out


def _training_prompts(args, loaded, data: Path) -> list:
    """Built prompts, with `--self-prompts` of them written by the target, interleaved
    so that any prefix the token budget reaches holds both in proportion."""
    import math

    from verispec.training.material import build_prompts

    share = args.self_prompts
    # About 150 tokens per built prompt's response; spare prompts cover early EOS. The
    # target's own requests are mostly open-ended and answered at length.
    built = build_prompts(max(32, round((1 - share) * args.tokens / 60)), args.seed) \
        if share < 1 else []
    if not share:
        return built
    from tqdm.auto import tqdm

    from verispec.training.self_prompts import SelfPromptSettings, self_prompts

    wanted = max(8, math.ceil(share * args.tokens / 120))
    with tqdm(total=wanted, desc="self prompts", unit="prompt", dynamic_ncols=True,
              disable=args.no_progress) as bar:
        own = self_prompts(loaded.target, loaded.tokenizer,
                           SelfPromptSettings(wanted, seed=args.seed, batch_size=args.batch),
                           data / f"self-prompts-{args.seed}.jsonl", progress=bar.update)
    return interleave(own, built)


def interleave(a: list, b: list) -> list:
    """a and b merged in order so that every prefix holds each in proportion."""
    mixed, i, j = [], 0, 0
    while i < len(a) or j < len(b):
        if j >= len(b) or (i < len(a) and i / len(a) <= j / len(b)):
            mixed.append(a[i])
            i += 1
        else:
            mixed.append(b[j])
            j += 1
    return mixed


def cmd_train_head(args) -> int:
    import torch

    from verispec.models.loading import load_target
    from verispec.training.pipeline import PipelineSettings, check_data_dir, run_pipeline
    from verispec.training.responses import GenerationSettings
    from verispec.training.trainer import TrainSettings

    if args.tokens < 1 or args.steps < 1:
        raise ValueError("--tokens and --steps must be >= 1")
    if not 0 <= args.self_prompts <= 1:
        raise ValueError(f"--self-prompts is a share in [0, 1], got {args.self_prompts}")
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_target(args.target, backend=args.backend, dtype=args.dtype)
    if loaded.tokenizer is None:
        raise ValueError(f"{args.target} has no tokenizer; training prompts are text")
    settings = PipelineSettings(
        kind=args.head_type, out=Path(args.out),
        generation=GenerationSettings(max_new_tokens=args.max_new_tokens, token_budget=args.tokens,
                                      seed=args.seed, batch_size=args.batch),
        train=TrainSettings(steps=args.steps, batch_size=args.batch_size, max_len=args.max_len,
                            lr=args.lr or (1e-3 if args.head_type == "medusa" else 5e-4),
                            unroll=args.unroll, seed=args.seed),
        data=Path(args.data) if args.data else Path(args.out) / "data",
        extra_data=tuple(Path(d) for d in args.extra_data),
        self_prompts=args.self_prompts, fused=args.fused,
        draft_vocab=args.draft_vocab, num_medusa=args.medusa_heads, resume=args.resume,
        export=Path(args.export) if args.export else None, progress=not args.no_progress,
        init=Path(args.init) if args.init else None)
    # Claimed first: self-written prompts are generated into it, minutes of work.
    data = check_data_dir(loaded.target, settings)
    prompts = encode_prompts(loaded.tokenizer, _training_prompts(args, loaded, data))
    others = _other_fingerprints(args.target, loaded.backend, loaded.target.dtype)
    command = "verispec " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    result = run_pipeline(loaded.target, prompts, settings, others, target_name=args.target,
                          command=command)
    t = result.config.training
    print(f"[verispec] {args.head_type} head -> {result.folder} ({t['steps']} steps on "
          f"{t['positions']} positions, {t['response_tokens']} from responses; final loss "
          f"{t['final_loss']}, first-draft top-1 {t['final_top1']}); curve: {result.plot}")
    return 0
