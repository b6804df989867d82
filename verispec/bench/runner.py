"""The benchmark loop: which configurations run, on which token ids, in what
order, and the raw per-prompt record each run leaves behind.

Every configuration sees exactly the same prompt ids (the chat template is
applied once, here), and runs are interleaved per prompt so that machine drift
(thermal throttling, a noisy neighbour) hits every configuration alike instead
of whichever happened to run last.
"""
from __future__ import annotations

import gc
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Sequence

import torch
from tqdm import tqdm

from verispec.bench.collector import frozen_heap
from verispec.bench.configs import PEER, BenchConfig
from verispec.bench.workloads import Prompt, validate_output
from verispec.config import Grammar, SamplingParams
from verispec.proposers.suffix_store import SuffixStore
from verispec.step.lossless import compare_greedy
from verispec.step.sequence import validate_prompt

_WARMUP_TOKENS = 8


@dataclass
class PeerOutput:
    """What a peer's run returns (verispec.bench.peers, verispec.bench.llamacpp)."""
    token_ids: list[int]
    seconds: float
    finish_reason: str
    # A peer that reports its own timings (llama-server) splits its time as verispec does,
    # and a speculative one its draft counts.
    prefill_seconds: float | None = None
    decode_seconds: float | None = None
    drafted: int | None = None
    accepted: int | None = None
    cpu_seconds: float | None = None  # a peer in another process: that process's CPU time


@dataclass(frozen=True)
class BenchPrompt:
    """A prompt after tokenization: what every configuration is fed."""
    id: str
    workload: str
    ids: tuple[int, ...]
    # A prompt with a response_format (the structured workload): every config runs under
    # its grammar, and the output is validated against its JSON schema.
    grammar: Grammar | None = field(default=None, hash=False, compare=False)
    schema: dict | None = field(default=None, hash=False, compare=False)
    prediction: tuple[int, ...] | None = field(default=None, hash=False, compare=False)


@dataclass
class TimeSplit:
    prefill: float = 0.0
    draft: float = 0.0
    verify: float = 0.0
    other: float = 0.0
    total: float = 0.0


@dataclass
class RunRecord:
    workload: str
    prompt_id: str
    config: str  # BenchConfig.label
    kind: str
    k: int
    prompt_tokens: int
    tokens: int  # new tokens produced
    seconds: float  # wall time of the whole call, prefill included, timed from outside
    finish_reason: str = ""
    drafted: int | None = None  # verispec only; peers expose no draft statistics
    accepted: int | None = None
    target_forwards: int | None = None
    time_split: TimeSplit | None = None  # verispec's own timers, in seconds
    token_ids: list[int] = field(default_factory=list)
    # Greedy equality: "identical", "near-tie", "mismatch"; None for the
    # reference itself, for a run without that reference, or when sampling.
    vs_plain: str | None = None
    vs_plain_at: int | None = None  # first divergent token index
    vs_hf_plain: str | None = None
    vs_hf_plain_at: int | None = None
    # Per target pass, for trajectory plots: draft length asked, proposer that drafted.
    step_k: list[int] = field(default_factory=list)
    step_proposer: list[str] = field(default_factory=list)
    step_evidence: list[int | None] = field(default_factory=list)  # evidence behind an adaptive k
    # With --repeats R: every run's wall time; `seconds` is their median. Outputs and
    # statistics are those of the first run (a seeded run repeats them exactly).
    seconds_all: list[float] = field(default_factory=list)
    # verispec only: every run's decode time (its own total less its prefill), the part
    # of a generation that the draft length can change.
    decode_seconds_all: list[float] = field(default_factory=list)
    adaptive: bool = False  # the config chooses k or the proposer per step (trajectory plots)
    # Under a prompt's grammar: seconds in the grammar engine, grammar-forced drafts, and
    # whether the output validates against the prompt's schema ("valid", "invalid", or
    # "cut": ended by max_new_tokens before the JSON closed).
    grammar_seconds: float | None = None
    grammar_forced: int | None = None
    schema_valid: str | None = None
    # CPU seconds of this process over the same call (all its threads; median over
    # repeats): time the machine's other tenants took the cores is not in it.
    cpu_seconds: float | None = None
    cpu_seconds_all: list[float] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_tokens_per_s(self) -> float | None:
        """New tokens per CPU second of the process (median over repeats)."""
        return self.tokens / self.cpu_seconds if self.cpu_seconds else None

    @property
    def decode_tokens_per_s(self) -> float | None:
        """New tokens per second of decoding (median over repeats), prefill excluded."""
        if not self.decode_seconds_all:
            return None
        seconds = statistics.median(self.decode_seconds_all)
        return self.tokens / seconds if seconds > 0 else None


def encode_prompts(engine, prompts: Sequence[Prompt], sampling: SamplingParams) -> list[BenchPrompt]:
    """Tokenize once and check every prompt fits before any timing starts, so a
    long document fails the run in a second, not after an hour."""
    encoded = []
    for prompt in prompts:
        ids = engine.encode_messages(list(prompt.messages))
        try:
            validate_prompt(engine.target, ids, sampling)
        except ValueError as exc:
            raise ValueError(f"prompt {prompt.id}: {exc}") from None
        prediction = engine.prediction_ids(prompt.prediction) if prompt.prediction else None
        encoded.append(BenchPrompt(prompt.id, prompt.workload, tuple(ids), prompt.grammar(),
                                   prompt.schema(), prediction))
    return encoded


def _sync(device: torch.device) -> None:
    # CUDA kernels run asynchronously; without a sync the clock stops too early.
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Runner:
    """Runs one (prompt, config) pair and returns its RunRecord."""

    def __init__(self, engine, sampling: SamplingParams, peers=None) -> None:
        self.engine = engine
        self.sampling = sampling
        self.peers = peers  # a peers.PeerRunner, or None when no peer is benchmarked
        self.device = engine.target.device

    def run(self, prompt: BenchPrompt, config: BenchConfig,
            sampling: SamplingParams | None = None) -> RunRecord:
        sampling = sampling or self.sampling
        if prompt.grammar is not None:
            sampling = replace(sampling, grammar=prompt.grammar)
        gc.collect()
        if config.kind == PEER:
            if prompt.grammar is not None:
                raise ValueError(f"prompt {prompt.id} has a response_format, which peers do not "
                                 "apply: bench it without --peers")
            if self.peers is None:
                raise ValueError(f"peer {config.label} needs a PeerRunner")
            cpu = time.process_time()
            out = self.peers.run(config, list(prompt.ids), sampling)
            split = None
            if out.prefill_seconds is not None and out.decode_seconds is not None:
                split = TimeSplit(prefill=out.prefill_seconds,
                                  total=out.prefill_seconds + out.decode_seconds)
            return RunRecord(prompt.workload, prompt.id, config.label, config.kind, config.k,
                             len(prompt.ids), len(out.token_ids), out.seconds,
                             drafted=out.drafted, accepted=out.accepted, time_split=split,
                             token_ids=out.token_ids, finish_reason=out.finish_reason,
                             cpu_seconds=(out.cpu_seconds if out.cpu_seconds is not None
                                          else time.process_time() - cpu))
        _sync(self.device)
        cpu = time.process_time()
        start = time.perf_counter()
        prediction = list(prompt.prediction) if config.prediction and prompt.prediction else None
        result = self.engine.generate(list(prompt.ids), sampling, config.spec,
                                      prediction=prediction)
        _sync(self.device)
        seconds = time.perf_counter() - start
        cpu = time.process_time() - cpu
        s = result.stats
        split = TimeSplit(s.time_prefill, s.time_draft, s.time_verify, s.time_other, s.time_total)
        return RunRecord(prompt.workload, prompt.id, config.label, config.kind, config.k,
                         len(prompt.ids), len(result.token_ids), seconds, result.finish_reason,
                         s.drafted, s.accepted, s.target_forwards, split, list(result.token_ids),
                         cpu_seconds=cpu,
                         step_k=[step.k for step in s.steps],
                         step_proposer=[step.proposer for step in s.steps],
                         step_evidence=[step.evidence for step in s.steps],
                         adaptive=s.adaptive,
                         **self._structured(prompt, result))

    def _structured(self, prompt: BenchPrompt, result) -> dict:
        if prompt.grammar is None:
            return {}
        valid = None
        if prompt.schema is not None:
            valid = validate_output(prompt.schema, self.engine.decode(list(result.token_ids)),
                                    result.finish_reason)
        return {"grammar_seconds": result.stats.time_grammar,
                "grammar_forced": result.stats.grammar_forced, "schema_valid": valid}


def runs_on(prompt: BenchPrompt, config: BenchConfig) -> bool:
    """Peers apply no grammar, so a prompt with a response_format runs on verispec only."""
    return config.kind != PEER or prompt.grammar is None


def warm_up(runner: Runner, prompt: BenchPrompt, configs: Sequence[BenchConfig]) -> None:
    """One short untimed generation per config: loads drafts, fills allocator
    pools and lets one-time kernel selection happen outside the clock."""
    short = replace(runner.sampling, max_new_tokens=min(_WARMUP_TOKENS, runner.sampling.max_new_tokens))
    # Warm-up outputs must not teach the suffix store: a cold run starts it empty.
    engine = runner.engine
    kept = getattr(engine, "suffix_store", None)
    if kept is not None:
        engine.suffix_store = SuffixStore()
    try:
        for config in configs:
            if runs_on(prompt, config):
                runner.run(prompt, config, short)
    finally:
        if kept is not None:
            engine.suffix_store = kept


def run_bench(runner: Runner, prompts: Sequence[BenchPrompt], configs: Sequence[BenchConfig],
              progress: bool = True, warmup: bool = True, repeats: int = 1) -> list[RunRecord]:
    """Every config on every prompt, `repeats` times each; a record's time is
    the median of its repeats, which are interleaved with the other configs'
    so that a burst of machine noise costs one repeat, not one config."""
    if not prompts or not configs:
        raise ValueError("nothing to run: no prompts or no configurations")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if warmup:
        warm_up(runner, prompts[0], configs)
    # What is alive now (the model, the modules) outlives the bench: frozen, it is out of the
    # collection before each run, which then walks only what the runs left behind.
    with frozen_heap():
        return _run_all(runner, prompts, configs, progress, repeats)


def _run_all(runner: Runner, prompts: Sequence[BenchPrompt], configs: Sequence[BenchConfig],
             progress: bool, repeats: int) -> list[RunRecord]:
    records: list[RunRecord] = []
    bar = tqdm(total=len(prompts) * len(configs) * repeats, file=sys.stderr, unit="run",
               desc="bench", disable=not progress, dynamic_ncols=True)
    engine = runner.engine
    with bar:
        for i, prompt in enumerate(prompts):
            mine: dict[str, RunRecord] = {}
            # Every run of a prompt, every config and repeat, starts from the suffix store
            # as the earlier prompts left it; otherwise a repeat (or the next config) would
            # draft the very output it is about to produce and time a replay.
            before = getattr(engine, "suffix_store", None)
            for rep in range(repeats):
                # Rotate the order per prompt and repeat so no config always runs first
                # after a prompt change (cold caches) or right after the most expensive one.
                shift = (i + rep) % len(configs)
                for config in list(configs[shift:]) + list(configs[:shift]):
                    if not runs_on(prompt, config):
                        bar.update()
                        continue
                    bar.set_postfix_str(f"{prompt.workload}/{prompt.id} {config.label}",
                                        refresh=False)
                    if before is not None:
                        engine.suffix_store = before.copy()
                    record = runner.run(prompt, config)
                    kept = mine.setdefault(config.label, record)
                    kept.seconds_all.append(record.seconds)
                    if record.cpu_seconds is not None:
                        kept.cpu_seconds_all.append(record.cpu_seconds)
                    if record.time_split is not None:
                        kept.decode_seconds_all.append(
                            record.time_split.total - record.time_split.prefill)
                    bar.update()
            if before is not None:
                # The session learns this prompt's answer once: the first config's.
                engine.suffix_store = before
                before.add(mine[configs[0].label].token_ids)
            for record in mine.values():
                record.seconds = statistics.median(record.seconds_all)
                if record.cpu_seconds_all:
                    record.cpu_seconds = statistics.median(record.cpu_seconds_all)
                records.append(record)
    order = {c.label: n for n, c in enumerate(configs)}
    position = {p.id: n for n, p in enumerate(prompts)}
    records.sort(key=lambda r: (position[r.prompt_id], order[r.config]))
    return records


def _status(cmp) -> str:
    return "identical" if cmp.identical else "near-tie" if cmp.near_tie else "mismatch"


def check_equality(target, prompts: Sequence[BenchPrompt], records: list[RunRecord],
                   configs: Sequence[BenchConfig], hf_plain: str | None = "hf-plain",
                   peers=None) -> None:
    """Fill vs_plain / vs_hf_plain of every greedy record in place.

    Only the common length is compared (HF generate and a stop can end a run
    early); a difference is classified by `compare_greedy`, which recomputes
    the plain logits at the first divergence to tell a near-tie from a bug.
    A config with an `own_reference` is compared with that run only, in vs_plain,
    by `peers.compare` in its own numerics.
    """
    plain_label = next((c.label for c in configs if c.is_plain), None)
    own = {c.label: c for c in configs if c.own_reference}
    ids = {p.id: list(p.ids) for p in prompts}
    by_key = {(r.prompt_id, r.config): r for r in records}
    for reference, attr in ((plain_label, "vs_plain"), (hf_plain, "vs_hf_plain")):
        if reference is None:
            continue
        for record in records:
            ref = by_key.get((record.prompt_id, reference))
            if ref is None or record is ref or record.config in own:
                continue
            cmp = compare_greedy(target, ids[record.prompt_id], ref.token_ids, record.token_ids)
            setattr(record, attr, _status(cmp))
            setattr(record, attr + "_at", cmp.diverged_at)
    for record in records:
        config = own.get(record.config)
        if config is None or peers is None:
            continue
        ref = by_key.get((record.prompt_id, config.own_reference))
        if ref is None or record is ref:
            continue
        cmp = peers.compare(config, ids[record.prompt_id], ref.token_ids, record.token_ids)
        record.vs_plain, record.vs_plain_at = _status(cmp), cmp.diverged_at


def environment(engine) -> dict:
    """Where a number was measured: enough to tell two machines' results apart."""
    import os
    import platform
    import shlex
    from datetime import datetime, timezone

    import transformers

    from verispec import __version__

    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            cpu = next((line.split(":", 1)[1].strip() for line in fh
                        if line.startswith("model name")), cpu)
    except OSError:
        pass
    target = engine.target
    config = getattr(target, "config", None)
    device = torch.device(target.device)
    return {
        "cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "torch": torch.__version__, "transformers": transformers.__version__,
        "verispec": __version__, "python": platform.python_version(),
        "platform": platform.platform(), "dtype": str(target.dtype).replace("torch.", ""),
        "device": str(device), "model": target.name,
        "weights": getattr(target, "weights_kind", None),
        "model_path": getattr(config, "_name_or_path", None),
        "command": shlex.join([os.path.basename(sys.argv[0]), *sys.argv[1:]]),
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
