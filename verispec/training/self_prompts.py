"""Training prompts written by the target itself (Magpie: Xu et al. 2024).

Fed only its chat template up to the start of a user turn, an instruct model
samples what a user might ask, because that is what followed in its own
fine-tuning data. On this machine the word lists of topics.py give a few
thousand open-ended prompts, and a head trained on the answers to them fits
those answers far better than it drafts for new requests (docs/notebook/heads.md,
"Held-out evaluation"). The target's own requests have no such ceiling: each
one is a fresh sample from everything it was tuned on.

A short opener ("Write a", "How do I", ...) starts some user turns, so the
requests cover the kinds the bench measures (creative writing and chat) as
well as whatever else the model asks. The requests are kept only when they
ended by themselves (EOS before the cap), read as plain text (97% printable
ASCII) and share no eight-word run with any bench prompt; duplicates are
dropped. They are cached in DATA/self-prompts-SEED.jsonl, so a resumed run
reads them back.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from verispec.models.base import TargetModel
from verispec.prompt_ids import template_text_ids
from verispec.training.material import TrainingPrompt, _bench_lines, _normal
from verispec.training.responses import GenerationSettings, PromptIds, decode_prompts, read_records

# Weighted by repetition: about one turn in six starts free, the rest lean to the
# creative and chat requests where model-free drafts fail.
OPENERS = ("", "", "", "", "", "Write a", "Write a short", "Write a poem", "Write a story",
           "Compose", "Describe", "Can you write", "Tell me", "Create", "Imagine",
           "What is", "What are", "How do I", "How can I", "Why do", "Why is", "Explain",
           "I have", "I'm", "Give me", "What's the difference between", "Could you",
           "Help me", "Summarize")
SHINGLE = 8  # words in a run that, shared with a bench prompt, excludes a request
_WORD = re.compile(r"[a-z0-9']+")


@dataclass(frozen=True)
class SelfPromptSettings:
    count: int  # requests wanted (the generation stops once this many are kept)
    seed: int = 0
    temperature: float = 1.0  # the model's own distribution: variety is the point
    top_p: float = 0.95  # trims the tail that turns a request into noise
    max_tokens: int = 64  # a request still going at the cap is dropped, not cut
    batch_size: int = 32
    attempts_per_prompt: int = 20  # give up (clear error) past count * this many samples


def turn_prefix(tokenizer) -> list[int]:
    """Token ids of the chat template up to where a user's words begin."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("self-written prompts need a tokenizer with a chat template: "
                         "the target is asked to write a user's turn")
    marker = "\u2063MARKER\u2063"
    text = tokenizer.apply_chat_template([{"role": "user", "content": marker}],
                                         add_generation_prompt=False, tokenize=False)
    return template_text_ids(tokenizer, text[:text.index(marker)])


def _shingles(text: str) -> set[tuple[str, ...]]:
    words = _WORD.findall(text.lower())
    return {tuple(words[i:i + SHINGLE]) for i in range(len(words) - SHINGLE + 1)}


class RequestFilter:
    """Keeps plain-text, complete, new requests that overlap no bench prompt."""

    def __init__(self) -> None:
        _, contents = _bench_lines()
        self.bench = set().union(*(_shingles(c) for c in contents))
        self.bench_contents = contents
        self.seen: set[str] = set()

    def accept(self, text: str) -> bool:
        words = text.split()
        if not 4 <= len(words) <= 120:
            return False
        printable = sum(ch.isascii() and (ch.isprintable() or ch == "\n") for ch in text)
        if printable < 0.97 * len(text) or "http" in text or "<|" in text:
            return False
        key = _normal(text)
        if key in self.seen or key in self.bench_contents or _shingles(text) & self.bench:
            return False
        self.seen.add(key)
        return True


def _prompt(record: dict) -> TrainingPrompt:
    return TrainingPrompt(record["id"], "self", ({"role": "user", "content": record["text"]},),
                          "target")


def _read(path: Path) -> list[TrainingPrompt]:
    return [_prompt(r) for r in read_records(path) if "id" in r and "text" in r]


def self_prompts(target: TargetModel, tokenizer, settings: SelfPromptSettings, path: Path,
                 progress: Callable[[int], None] | None = None) -> list[TrainingPrompt]:
    """`settings.count` requests written by the target, read from `path` where a
    previous run left them and generated (then appended there) otherwise."""
    kept = _read(path)
    if progress:
        progress(min(len(kept), settings.count))
    if len(kept) >= settings.count:
        return kept[:settings.count]
    prefix = turn_prefix(tokenizer)
    gen = GenerationSettings(max_new_tokens=settings.max_tokens, token_budget=0,
                             sample_fraction=1.0, temperature=settings.temperature,
                             top_p=settings.top_p, seed=settings.seed,
                             batch_size=settings.batch_size)
    keep = RequestFilter()
    for prompt in kept:
        keep.accept(prompt.messages[0]["content"])
    start = len(kept)
    eos = target.eos_token_ids
    opener_of: dict[str, str] = {}
    limit = settings.count * settings.attempts_per_prompt

    def asks():
        # Ids name the resume point, so no attempt repeats the sampling seed of an earlier one.
        attempt = 0
        while attempt < limit:
            opener = OPENERS[attempt % len(OPENERS)]
            ask = f"ask-{settings.seed}-{start}-{attempt}"
            opener_of[ask] = opener
            ids = prefix + (template_text_ids(tokenizer, opener) if opener else [])
            yield PromptIds(ask, "self", ids)
            attempt += 1

    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        for prompt, _, written in decode_prompts(target, asks(), gen,
                                                 lambda: len(kept) >= settings.count):
            opener = opener_of.pop(prompt.id)
            if not written or written[-1] not in eos:
                continue
            words = tokenizer.decode(written[:-1], skip_special_tokens=True)
            text = (f"{opener} {words.lstrip()}" if opener else words).strip()
            if len(kept) >= settings.count or not keep.accept(text):
                continue
            record = {"id": f"self-{settings.seed}-{len(kept)}", "text": text}
            out.write(json.dumps(record) + "\n")
            out.flush()
            kept.append(_prompt(record))
            if progress:
                progress(1)
    if len(kept) < settings.count:
        raise ValueError(f"the target wrote only {len(kept)} usable requests of "
                         f"{settings.count} in {limit} attempts (kept in {path}): it rarely ends "
                         "a user turn with EOS in plain text; lower --self-prompts")
    return kept[:settings.count]
