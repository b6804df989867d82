"""Baselines from the stacks people would otherwise use, run in the same
process on the same prompt ids as verispec, so a speedup is measured against
them, not against our own slow path.

transformers, on the same model object and dtype:
  hf-plain        model.generate(do_sample=False): the reference for speedups
  hf-static       the same with a static KV cache (cache_implementation="static"),
                  which transformers compiles for decoding where torch.compile works
  hf-pld          prompt lookup decoding, prompt_lookup_num_tokens=k (Saxena 2023)
  hf-assisted     assisted generation with a draft model (Leviathan et al. 2023)
llama.cpp's own llama-server, over HTTP in its own process (bench/llamaserver.py):
  llamaserver-plain, llamaserver-ngram-mod and its other speculative types.
  llama.cpp is timed only there: beside torch in one process, torch's spinning
  workers take about 10% from llama.cpp's pool, and OMP_WAIT_POLICY=PASSIVE, set for
  either, slows the other (docs/benchmarks.md).
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch

from verispec.bench import llamaserver
from verispec.bench.configs import PEER, BenchConfig
from verispec.bench.runner import PeerOutput
from verispec.config import SamplingParams
from verispec.models.loading import DEFAULT_MODEL
from verispec.step.lossless import Comparison

PEERS: dict[str, str] = {
    "hf-plain": "transformers generate, greedy",
    "hf-static": "transformers generate with a static KV cache (compiled decoding)",
    "hf-pld": "transformers prompt lookup decoding (prompt_lookup_num_tokens=k)",
    "hf-assisted": "transformers assisted generation with --draft as assistant_model",
    **llamaserver.SERVER_PEERS,
}
HF_PEERS = ("hf-plain", "hf-static", "hf-pld", "hf-assisted")
_PLAIN_PEERS = ("hf-plain", "hf-static")
_STACKS = ((tuple(llamaserver.SERVER_PEERS), llamaserver.PLAIN, llamaserver.missing_reason),)


@dataclass
class PeerSelection:
    configs: list[BenchConfig]
    notes: list[str]  # why a requested peer was left out


def parse_peers(text: str, k: int, draft: str | None) -> PeerSelection:
    """`hf-plain,hf-pld` -> peer configs; `none` or an empty string -> no peers."""
    names: list[str] = []
    for name in (t.strip() for t in text.split(",")):
        if not name or name == "none" or name in names:
            continue
        if name not in PEERS:
            raise ValueError(f"unknown peer {name!r}; choose from {', '.join(PEERS)} or none")
        names.append(name)
    configs, notes = [], []
    skipped: set[str] = set()
    own: dict[str, str] = {}  # a peer on other numerics -> its own plain run
    for stack, plain, missing_reason in _STACKS:
        wanted = [n for n in names if n in stack]
        own.update((n, plain) for n in wanted)
        missing = missing_reason() if wanted else None
        if missing:
            notes.append(f"{', '.join(wanted)} skipped: {missing}")
            skipped.update(wanted)
    for name in names:
        if name == "hf-assisted" and not draft:
            notes.append("hf-assisted skipped: it needs a draft model, give --draft PATH")
            continue
        if name == llamaserver.DRAFT and not (draft or "").endswith(".gguf"):
            notes.append(f"{name} skipped: it needs --draft PATH.gguf with the target's vocabulary "
                         "(llama-server has no self-style draft)")
            continue
        if name in skipped:
            continue
        # llama-server's speculative types keep their own draft lengths (its defaults).
        peer_k = 0 if name in _PLAIN_PEERS or name in llamaserver.SERVER_PEERS else k
        configs.append(BenchConfig(name, PEER, name, peer_k, peer=name, own_reference=own.get(name)))
    return PeerSelection(configs, notes)


def needs_hf(configs) -> bool:
    """Whether any of `configs` runs transformers' generate."""
    return any(c.kind == PEER and c.peer in HF_PEERS for c in configs)


def hf_model_of(target):
    """The transformers model behind a TargetModel, or None for other backends."""
    model = getattr(target, "model", None)
    return model if model is not None and hasattr(model, "generate") else None


class PeerRunner:
    """Runs every peer config on the runner of its stack. A stack that cannot
    run here (no transformers model behind the target, no GGUF, no llama-server)
    leaves a note in `notes` and its configs out of `runs`."""

    def __init__(self, engine, draft: str | None = None, configs=(),
                 model: str | None = DEFAULT_MODEL) -> None:
        self.notes: list[str] = []
        self._runners: dict[str, object] = {}
        peers = list(dict.fromkeys(c.peer for c in configs if c.kind == PEER))
        hf = [p for p in peers if p in HF_PEERS]
        if hf:
            self._add(hf, lambda: HFPeers(engine, draft))
        on_server = [p for p in peers if p in llamaserver.SERVER_PEERS]
        if on_server:
            server = self._add(on_server, lambda: llamaserver.LlamaServerPeers(
                llamaserver.gguf_path(model), engine.target, draft=draft))
            if server is not None:
                self.notes.append(f"llama-server: {server.binary} ({server.version()}), "
                                  f"{server.threads} thread(s)")

    def _add(self, names: list[str], make):
        """Runs `names` on the runner `make` builds; a note when it cannot be built."""
        try:
            runner = make()
        except ValueError as exc:
            self.notes.append(f"peers skipped ({', '.join(names)}): {exc}")
            return None
        self._runners.update((p, runner) for p in names)
        return runner

    def runs(self, config: BenchConfig) -> bool:
        return config.peer in self._runners

    def run(self, config: BenchConfig, ids: list[int], sampling: SamplingParams) -> PeerOutput:
        if config.peer not in self._runners:
            raise ValueError(f"peer {config.peer!r} cannot run here")
        return self._runners[config.peer].run(config, ids, sampling)

    def compare(self, config: BenchConfig, prompt: list[int], reference: list[int],
                ids: list[int]) -> Comparison:
        """Greedy equality of a peer that runs its own weights, judged in its own numerics."""
        return self._runners[config.peer].compare(prompt, reference, ids)

    def close(self) -> None:
        """Stop the peers that run in processes of their own."""
        for runner in set(self._runners.values()):
            if hasattr(runner, "close"):
                runner.close()


class HFPeers:
    def __init__(self, engine, draft: str | None = None) -> None:
        self.engine = engine
        self.model = hf_model_of(engine.target)
        if self.model is None:
            raise ValueError(f"HF peers need a transformers model; {engine.target.name} "
                             "is another backend (use --peers none)")
        self.draft = draft
        self._assistant = None
        gen = self.model.generation_config
        eos = sorted(engine.target.eos_token_ids)
        pad = getattr(gen, "pad_token_id", None)
        # A pad id only silences generate's warning: batch size 1 never pads.
        self.pad_token_id = pad if pad is not None else (eos[0] if eos else 0)

    def assistant(self):
        """The draft as a transformers model, with a constant draft length of k:
        HF's default schedule grows and shrinks it, which is a different algorithm."""
        if self._assistant is None:
            model = hf_model_of(self.engine.load_draft(self.draft))
            if model is None:
                raise ValueError(f"hf-assisted: draft {self.draft} is not a transformers model")
            # self:L shares the target's module objects; a private generation config
            # keeps the assistant's settings off the target.
            model.generation_config = copy.deepcopy(model.generation_config)
            model.generation_config.num_assistant_tokens_schedule = "constant"
            # No early exit on low draft confidence: verispec drafts all k tokens too.
            model.generation_config.assistant_confidence_threshold = 0.0
            self._assistant = model
        return self._assistant

    def _kwargs(self, config: BenchConfig, sampling: SamplingParams) -> dict:
        n = sampling.max_new_tokens
        kwargs: dict = {"max_new_tokens": n, "pad_token_id": self.pad_token_id,
                        "do_sample": not sampling.greedy}
        if sampling.ignore_eos:
            kwargs["min_new_tokens"] = n
        if not sampling.greedy:
            kwargs.update(temperature=sampling.temperature, top_k=sampling.top_k,
                          top_p=sampling.top_p)
        if config.peer == "hf-pld":
            kwargs["prompt_lookup_num_tokens"] = config.k
        elif config.peer == "hf-assisted":
            assistant = self.assistant()
            assistant.generation_config.num_assistant_tokens = config.k
            kwargs["assistant_model"] = assistant
        elif config.peer == "hf-static":
            kwargs["cache_implementation"] = "static"
        elif config.peer != "hf-plain":
            raise ValueError(f"unknown peer {config.peer!r}")
        return kwargs

    @torch.inference_mode()
    def run(self, config: BenchConfig, ids: list[int], sampling: SamplingParams) -> PeerOutput:
        kwargs = self._kwargs(config, sampling)
        device = self.engine.target.device
        input_ids = torch.tensor([ids], device=device)
        mask = torch.ones_like(input_ids)
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        out = self.model.generate(input_ids, attention_mask=mask, **kwargs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
        new = [int(t) for t in out[0, len(ids):].tolist()]
        eos = self.engine.target.eos_token_ids
        reason = "stop" if new and new[-1] in eos and not sampling.ignore_eos else "length"
        return PeerOutput(new, seconds, reason)
