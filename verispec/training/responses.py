"""Phase 1 of head training: the target answers the training prompts.

At inference a head only ever sees text the target wrote, so it trains on
the target's own responses, not on someone else's (EAGLE trains on target
outputs for the same reason; Medusa-2's self-distillation does too). Most
responses are greedy, as the benchmarks are; a seeded fraction is sampled at
a moderate temperature so the head also sees the target's less likely paths.

Responses are appended to a JSONL file as they finish, so an interrupted run
resumes where it stopped, and the file is the cache a second head type reuses.
Two ways to decode, same results:
- a backend that fuses `forward_batch` (several requests per call) decodes
  the prompts in batches, one token per request per call;
- otherwise each prompt runs through verispec's own engine with prompt-lookup
  drafts, which is lossless, so it yields the target's own greedy output (or
  a sample of its distribution) faster than plain decoding.
"""
from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch

from verispec.config import SamplingParams, SpecConfig
from verispec.models.base import BatchItem, TargetModel
from verispec.step.sampling import greedy_tokens, logits_to_probs, make_generator, sample


@dataclass(frozen=True)
class PromptIds:
    id: str
    kind: str
    tokens: list[int]


@dataclass
class Sample:
    id: str
    kind: str
    prompt: list[int]
    response: list[int]
    temperature: float

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.response


@dataclass(frozen=True)
class GenerationSettings:
    max_new_tokens: int = 200
    token_budget: int = 100_000  # stop after this many response tokens in all
    sample_fraction: float = 0.25  # share of prompts answered by sampling instead of greedily
    temperature: float = 0.8
    top_p: float = 1.0  # nucleus mass of the sampled share; 1 samples the whole distribution
    seed: int = 0
    batch_size: int = 32  # requests per forward_batch call, when the backend fuses them


def read_records(path: Path) -> list[dict]:
    """The JSON objects of an append-only cache file; an empty line, or one cut
    short by an interrupt, is skipped (its work is redone)."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def read_samples(path: Path) -> list[Sample]:
    samples = []
    for record in read_records(path):
        try:
            samples.append(Sample(**record))
        except TypeError:
            continue  # written by another version: regenerated
    return samples


def _sampling(prompt: PromptIds, settings: GenerationSettings) -> SamplingParams:
    # Seeded per prompt id, so a resumed run makes the same choice for the same prompt.
    rng = random.Random(f"{settings.seed}:{prompt.id}")
    sampled = rng.random() < settings.sample_fraction
    return SamplingParams(temperature=settings.temperature if sampled else 0.0,
                          top_p=settings.top_p if sampled else 1.0,
                          seed=rng.randrange(2**31), max_new_tokens=settings.max_new_tokens)


def generate_responses(target: TargetModel, prompts: Sequence[PromptIds], path: Path,
                       settings: GenerationSettings,
                       progress: Callable[[int], None] | None = None) -> list[Sample]:
    """Answer prompts until token_budget response tokens exist in `path`
    (including those a previous run left there); returns every sample, in the
    order they finished (deterministic: it depends on response lengths only)."""
    samples = read_samples(path)
    done = {s.id for s in samples}
    total = sum(len(s.response) for s in samples)
    if progress:
        progress(total)
    pending = iter([p for p in prompts if p.id not in done])

    def enough() -> bool:
        return total >= settings.token_budget

    with path.open("a") as out:
        for prompt, params, response in decode_prompts(target, pending, settings, enough):
            sample = Sample(prompt.id, prompt.kind, prompt.tokens, response, params.temperature)
            out.write(json.dumps(asdict(sample)) + "\n")
            out.flush()
            samples.append(sample)
            total += len(response)
            if progress:
                progress(len(response))
    return samples


Finished = Iterator[tuple[PromptIds, SamplingParams, list[int]]]


def decode_prompts(target: TargetModel, pending: Iterator[PromptIds], settings: GenerationSettings,
                   enough: Callable[[], bool]) -> Finished:
    """Continue each prompt until EOS or max_new_tokens, in the fastest way the
    backend allows; yields (prompt, its sampling params, new tokens incl. EOS)."""
    decode = _decode_continuous if target.fuses_batches else _decode_each
    yield from decode(target, pending, settings, enough)


def _decode_each(target: TargetModel, pending: Iterator[PromptIds], settings: GenerationSettings,
                 enough: Callable[[], bool]) -> Finished:
    from verispec.api import Engine

    engine = Engine(target)
    for prompt in pending:
        if enough():
            return
        params = _sampling(prompt, settings)
        result = engine.generate(prompt.tokens, params, SpecConfig(proposer="ngram", k=4))
        yield prompt, params, result.token_ids


@dataclass
class _Live:
    prompt: PromptIds
    params: SamplingParams
    generator: torch.Generator
    cache: object
    response: list[int]
    logits: torch.Tensor  # [vocab], the distribution of the next token


def _decode_continuous(target: TargetModel, pending: Iterator[PromptIds],
                       settings: GenerationSettings, enough: Callable[[], bool]) -> Finished:
    """Plain decoding of up to batch_size requests, one forward_batch call per
    token; a finished request's slot goes to the next prompt at once, so the
    batch stays full instead of draining to its longest response."""
    live: list[_Live] = []
    while True:
        while len(live) < settings.batch_size and not enough():
            prompt = next(pending, None)
            if prompt is None:
                break
            params = _sampling(prompt, settings)
            cache = target.new_cache(min(target.max_context,
                                         len(prompt.tokens) + params.max_new_tokens))
            # Prefilled alone: prompt lengths differ by 10x and one fused call
            # over all of them would only cost memory.
            logits = target.forward(torch.tensor(prompt.tokens), cache, num_logits=1).logits[-1]
            live.append(_Live(prompt, params, make_generator(params.seed, target.device), cache,
                              [], logits))
        if not live:
            return
        going = []
        for req in live:
            if req.params.greedy:  # argmax: a multinomial over a one-hot row is costly at a 49k vocabulary
                token = greedy_tokens(req.logits)
            else:
                token = int(sample(logits_to_probs(req.logits, req.params), req.generator))
            req.response.append(token)
            room = len(req.prompt.tokens) + len(req.response) < target.max_context
            if (token in target.eos_token_ids or not room
                    or len(req.response) >= req.params.max_new_tokens):
                yield req.prompt, req.params, req.response
            else:
                going.append(req)
        live = going
        if live:
            outs = target.forward_batch([BatchItem(torch.tensor([r.response[-1]]), r.cache,
                                                   num_logits=1) for r in live])
            for req, out in zip(live, outs):
                req.logits = out.logits[-1]
