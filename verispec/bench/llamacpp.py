"""llama.cpp as a CPU peer, through the optional `llama-cpp-python`
(`pip install 'verispec[llamacpp]'`: it compiles llama.cpp from source, see
docs/benchmarks.md for the build flags).

  llamacpp-plain  greedy decoding on the GGUF file itself
  llamacpp-pld    its prompt lookup decoding (LlamaPromptLookupDecoding, k tokens)

Both are fed verispec's prompt token ids, so tokenization and the chat template
are identical. Both read the same blocks, but llama.cpp multiplies them by
activations it quantizes to 8 bits (its own dot products, e.g. Q8_1 against
Q4_1), where verispec multiplies bf16 activations by the blocks' exact values:
the two are different functions, so their outputs are not compared. llamacpp-pld
is compared with llamacpp-plain instead, which checks llama.cpp's own speculation.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from verispec.bench.runner import PeerOutput
from verispec.config import SamplingParams
from verispec.step.lossless import Comparison, first_divergence

LLAMACPP_PEERS = ("llamacpp-plain", "llamacpp-pld")
PLAIN = "llamacpp-plain"
INSTALL_HINT = "pip install 'verispec[llamacpp]' (compiles llama.cpp; see docs/benchmarks.md)"
# The bf16 margin of verispec.step.lossless, so that "tie" means the same in every
# row of the table. llama.cpp's batched path (prefill, verification) and its
# one-token path differ by more than this: up to 0.4 on the chosen token's logit
# on the default model, so some divergences it calls "diff" are numerics.
NEAR_TIE = 0.1
_MIN_CONTEXT = 1024  # llamacpp-pld holds n_ctx x vocab fp32 logits: 200 MB here


def missing_reason() -> str | None:
    """Why llama_cpp cannot be used here, or None when it imports."""
    try:
        import llama_cpp  # noqa: F401
    except (ImportError, OSError) as exc:
        # OSError: the package is there but its compiled library does not load.
        return f"llama-cpp-python is not importable ({exc}); {INSTALL_HINT}"
    return None


def gguf_path(model: str | None) -> Path:
    """The GGUF file llama.cpp reads for the model verispec was asked to load."""
    from verispec.models.loading import DEFAULT_MODEL, default_gguf_path

    if model in (None, DEFAULT_MODEL):
        return default_gguf_path()
    path = Path(model).expanduser()
    if path.suffix != ".gguf" or not path.is_file():
        raise ValueError(f"they need a .gguf model and {model} is not one")
    return path


def context_bucket(n: int) -> int:
    # Power-of-two context sizes: a longer prompt later rebuilds the context
    # at most a few times, and never inside a timed call.
    size = _MIN_CONTEXT
    while size < n:
        size *= 2
    return size


class LlamaCppPeers:
    """Runs llamacpp-plain and llamacpp-pld on one GGUF file; each has its own
    llama.cpp context (prompt lookup needs logits at every position, plain
    decoding only at the last)."""

    def __init__(self, gguf: Path, target, threads: int | None = None) -> None:
        reason = missing_reason()
        if reason:
            raise ValueError(reason)
        self.gguf = Path(gguf)
        self.eos = frozenset(target.eos_token_ids)
        self.threads = threads or torch.get_num_threads()
        self._models: dict[str, tuple[int, object]] = {}
        vocab = self.model(PLAIN, _MIN_CONTEXT).n_vocab()
        if vocab != target.vocab_size:
            raise ValueError(f"{self.gguf.name} has {vocab} tokens and the target "
                             f"{target.vocab_size}: the token ids would not mean the same")

    def model(self, peer: str, needed: int):
        """The llama.cpp model of `peer`, with a context of at least `needed` tokens."""
        if peer not in LLAMACPP_PEERS:
            raise ValueError(f"unknown llama.cpp peer {peer!r}")
        held = self._models.get(peer)
        if held is not None and held[0] >= needed:
            return held[1]
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        n_ctx = context_bucket(needed)
        self._models.pop(peer, None)  # free the old context before allocating the new one
        draft = LlamaPromptLookupDecoding() if peer != PLAIN else None
        # With a draft model llama-cpp-python keeps logits of every position but
        # sizes its logits buffer from this flag alone (0.3.36): without it, a
        # prompt longer than n_batch overflows the buffer.
        llm = Llama(str(self.gguf), n_ctx=n_ctx, n_threads=self.threads,
                    n_threads_batch=self.threads, draft_model=draft,
                    logits_all=draft is not None, verbose=False)
        self._models[peer] = (n_ctx, llm)
        return llm

    @staticmethod
    def _sampler_kwargs(sampling: SamplingParams) -> dict:
        # Every filter llama-cpp-python enables by default is switched off, so only
        # the settings verispec's sampler has remain.
        if sampling.greedy:
            return {"temp": 0.0, "repeat_penalty": 1.0}
        return {"temp": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
                "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0}

    def run(self, config, ids: list[int], sampling: SamplingParams):
        llm = self.model(config.peer, len(ids) + sampling.max_new_tokens + config.k + 1)
        if llm.draft_model is not None:
            llm.draft_model.num_pred_tokens = config.k
        if sampling.seed is not None:
            llm.set_seed(sampling.seed)
        # generate() would reuse the KV cache of a previous run on the same prompt
        # and skip its prefill, which no other contender gets to do.
        llm.reset()
        stream = llm.generate(ids, reset=True, **self._sampler_kwargs(sampling))
        new: list[int] = []
        reason = "length"
        start = time.perf_counter()
        for token in stream:
            new.append(int(token))
            if token in self.eos and not sampling.ignore_eos:
                reason = "stop"
                break
            if len(new) >= sampling.max_new_tokens:
                break
        seconds = time.perf_counter() - start
        stream.close()
        return PeerOutput(new, seconds, reason)

    def plain_logits_at(self, prompt: list[int], plain: list[int], i: int) -> np.ndarray:
        """The logits llamacpp-plain saw before emitting plain[i], recomputed along
        its own path (the prompt in one batch, then one token per decode), so the
        margin is the one that run had."""
        llm = self.model(PLAIN, len(prompt) + i + 1)
        llm.reset()
        llm.eval(prompt)
        for token in plain[:i]:
            llm.eval([token])
        from llama_cpp import llama_get_logits_ith

        row = llama_get_logits_ith(llm.ctx, -1)
        return np.ctypeslib.as_array(row, shape=(llm.n_vocab(),)).copy()

    def compare(self, prompt: list[int], plain: list[int], other: list[int]) -> Comparison:
        """`verispec.step.lossless.compare_greedy` in llama.cpp's own numerics."""
        n = min(len(plain), len(other))
        i = first_divergence(plain[:n], other[:n])
        if i is None:
            return Comparison(identical=True)
        logits = self.plain_logits_at(prompt, plain, i)
        first, second = np.sort(logits)[-2:][::-1]
        gap = float(first - second)
        near = gap <= NEAR_TIE and float(first - logits[other[i]]) <= NEAR_TIE
        return Comparison(False, i, plain[i], other[i], gap, near)
