"""How well a trained head drafts on prompts it never trained on, without the clock.

Training reports the first-draft top-1 on its own batches. A head that fits its
training answers drives that figure up while its drafts on new prompts stay
where they were, so this module measures the drafts where they count: on the
target's greedy answers to the bench prompts (which head training never reads),
teacher-forced once.

Greedy verification keeps the leading drafts that equal the target's argmax, so
the chain a head drafts from an anchor a (it has the target's feature f_a and
token a + 1) is accepted up to its first mismatch with the target's greedy
tokens a + 2, a + 3, ... That is computed for every anchor in the answer at
once: EAGLE's unrolled training forward is exactly the chain from every anchor
(`EagleHead.unrolled`), and Medusa's heads read f_a alone. Reported per
workload: the share of anchors whose first draft is accepted, and the tokens
per target pass at k, 1 + mean accepted length. The engine anchors only at step
boundaries, so its tau weighs positions differently (8 creative prompts: the
engine measured 1.54 where this gives 1.64 with the shipped head).

`--by-key` splits the anchors by n-gram lookup's evidence (its matched suffix
length) and sets the head beside n-gram lookup under each key: the table
behind `auto`'s keyed choice (verispec.proposers.auto).

    python -m verispec.training.evaluate --workload creative,chat,mixed --limit 8 --by-key
"""
from __future__ import annotations

import argparse
from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from verispec.proposers.draft import common_prefix
from verispec.proposers.heads.format import read_head
from verispec.proposers.heads.runtime import build_module
from verispec.proposers.heads.target_parts import target_parts
from verispec.proposers.ngram import NgramIndex
from verispec.training.features import teacher_force


@dataclass
class Answer:
    workload: str
    tokens: torch.Tensor  # [T] int64, prompt then the target's greedy answer
    num_prompt: int
    features: tuple[torch.Tensor, ...]  # one [T, hidden] per layer the head reads
    greedy: torch.Tensor  # [T], the target's argmax after each position


def greedy_answers(engine, workloads: list[str], limit: int, max_new_tokens: int,
                   layers: tuple[int, ...]) -> list[Answer]:
    from verispec.bench.runner import encode_prompts
    from verispec.bench.workloads import load_workload
    from verispec.config import SamplingParams

    sampling = SamplingParams(max_new_tokens=max_new_tokens)
    answers = []
    for workload in workloads:
        for prompt in encode_prompts(engine, load_workload(workload, limit=limit), sampling):
            ids = list(prompt.ids) + engine.generate(list(prompt.ids), sampling).token_ids
            hidden, top, _ = teacher_force(engine.target, ids, layers, 1)
            answers.append(Answer(workload, torch.tensor(ids), len(prompt.ids), tuple(hidden),
                                  top[:, 0].long()))
    return answers


class HeadDrafts:
    """A head's greedy drafts from every anchor of an answer, in float32."""

    def __init__(self, head_dir: str, target, vocab_limit: int = 0) -> None:
        stored = read_head(head_dir)
        self.config = stored.config
        self.module = build_module(stored.config)
        self.module.load_state_dict({k: v.float() for k, v in stored.state.items()})
        self.module.eval()
        parts = target_parts(target)
        self.ids = torch.sort(stored.draft_vocab if stored.draft_vocab is not None
                              else torch.arange(target.vocab_size)).values
        if vocab_limit:
            self.ids = self.ids[:vocab_limit]  # as SpecConfig.head_vocab drafts at inference
        self.rows = parts.lm_rows(self.ids).float()  # [draft vocab, hidden]
        self.embed = parts.embed.float()
        self.norm_weight, self.eps = parts.norm_weight.float(), parts.rms_eps

    def _final_norm(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), eps=self.eps) * self.norm_weight

    @torch.no_grad()
    def chains(self, answer: Answer, k: int) -> torch.Tensor:
        """[T, k]: draft i of the chain anchored at row a, stored at row a."""
        length = answer.tokens.shape[0]
        if self.config.type == "eagle":
            feature = self.module.target_feature([h.float()[None] for h in answer.features])
            following = F.pad(answer.tokens[1:], (0, 1))
            steps = self.module.unrolled(feature, self.embed[following][None], k, self._final_norm)
            # Step i's row t belongs to the chain anchored at t - i.
            drafts = [F.pad(self.ids[(s[0] @ self.rows.T).argmax(-1)][i:], (0, i), value=-1)
                      for i, s in enumerate(steps)]
        else:
            outputs = self.module(answer.features[-1].float())  # [heads, T, hidden]
            drafts = [self.ids[(out @ self.rows.T).argmax(-1)] for out in outputs[:k]]
            drafts += [torch.full((length,), -1, dtype=torch.long)] * (k - len(drafts))
        return torch.stack(drafts, dim=1)


def accepted_lengths(drafts: torch.Tensor, answer: Answer) -> list[int]:
    """Greedy accepted length of the chain from each anchor a in the answer (the
    head knows token a + 1; its drafts are compared with tokens a + 2, ...)."""
    k = drafts.shape[1]
    length = answer.tokens.shape[0]
    out = []
    for a in range(max(0, answer.num_prompt - 1), length - k - 1):
        wanted = answer.greedy[a + 1:a + 1 + k]
        matches = (drafts[a] == wanted).long()
        out.append(int(matches.cumprod(0).sum()))
    return out


def ngram_lengths(answer: Answer, k: int) -> tuple[list[int], list[int]]:
    """n-gram lookup's evidence key and accepted length at the same anchors."""
    tokens = answer.tokens.tolist()
    index, keys, lengths = NgramIndex(1, 4), [], []
    for a in range(max(0, answer.num_prompt - 1), len(tokens) - k - 1):
        index.update(tokens[:a + 2])
        keys.append(min(index.longest_match(), 4))
        guess = (index.continuations(k, 1) or [[]])[0]
        lengths.append(common_prefix(guess, tokens[a + 2:a + 2 + len(guess)]))
    return keys, lengths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m verispec.training.evaluate",
        description="Held-out greedy acceptance of a trained head on the bench prompts' answers.")
    parser.add_argument("--head", action="append", default=None,
                        help="head directory (repeatable; default: the shipped eagle and medusa)")
    parser.add_argument("--workload", default="creative,chat,mixed")
    parser.add_argument("--limit", type=int, default=8, help="prompts per workload")
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--k", type=int, default=5, help="draft chain length")
    parser.add_argument("--head-vocab", type=int, default=None,
                        help="draft over this many of the head's tokens, lowest ids first, as "
                             "at inference (default: SpecConfig.head_vocab; 0 = all)")
    parser.add_argument("--by-key", action="store_true",
                        help="also split by n-gram lookup's matched suffix length")
    args = parser.parse_args(argv)
    from verispec.api import Engine
    from verispec.bench.workloads import parse_workloads
    from verispec.config import SpecConfig
    from verispec.proposers.heads.format import find_shipped

    limit = SpecConfig.head_vocab if args.head_vocab is None else args.head_vocab
    engine = Engine()
    heads = args.head or [str(find_shipped(kind, engine.target)) for kind in ("eagle", "medusa")]
    drafters = [HeadDrafts(h, engine.target, limit) for h in heads]
    layers = tuple(sorted({layer for d in drafters for layer in d.config.feature_layers}))
    answers = greedy_answers(engine, parse_workloads(args.workload), args.limit,
                             args.max_new_tokens, layers)
    for head, drafter in zip(heads, drafters):
        # A head reads its own layers, in its config's order, out of the shared features.
        per = defaultdict(list)
        keyed = defaultdict(list)
        for answer in answers:
            own = Answer(answer.workload, answer.tokens, answer.num_prompt,
                         tuple(answer.features[layers.index(layer)]
                               for layer in drafter.config.feature_layers), answer.greedy)
            lengths = accepted_lengths(drafter.chains(own, args.k), own)
            per[answer.workload] += lengths
            if args.by_key:
                keys, ngram = ngram_lengths(answer, args.k)
                for key, mine, theirs in zip(keys, lengths, ngram):
                    keyed[(answer.workload, key)].append((mine, theirs))
        print(f"\n{drafter.config.type} head {head} (k = {args.k}, greedy, teacher-forced, "
              f"{drafter.ids.numel()} draft tokens)")
        print("| workload | anchors | first draft accepted | tokens per pass |")
        print("|---|---|---|---|")
        for workload, lengths in per.items():
            t = torch.tensor(lengths, dtype=torch.float)
            print(f"| {workload} | {len(lengths)} | {(t >= 1).float().mean():.3f} | "
                  f"{1 + t.mean():.3f} |")
        if args.by_key:
            print("\n| workload | n-gram match length | anchors | head: first draft | "
                  "ngram: first draft | head: tokens per pass | ngram: tokens per pass |")
            print("|---|---|---|---|---|---|---|")
            for (workload, key), pairs in sorted(keyed.items()):
                t = torch.tensor(pairs, dtype=torch.float)
                label = f"{key}+" if key == 4 else str(key)
                first = (t >= 1).float().mean(0)  # [head, ngram]
                print(f"| {workload} | {label} | {len(pairs)} | {first[0]:.2f} | {first[1]:.2f} | "
                      f"{1 + t[:, 0].mean():.2f} | {1 + t[:, 1].mean():.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
