"""`Engine`: the Python API. It holds a target model, its tokenizer and any
loaded drafts, and turns text requests into calls of the id-only loop."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch

from verispec import proposers  # noqa: F401  (registers every proposer)
from verispec.config import DEFAULT_SPEC, SamplingParams, SpecConfig
from verispec.metrics import Stats
from verispec.models.base import TargetModel
from verispec.models.llama import NativeLlama
from verispec.models.loading import DEFAULT_MODEL, load_target, weights_label
from verispec.models.quant_draft import quantized_draft
from verispec.prompt_ids import chat_ids, prediction_ids, text_ids
from verispec.proposers.base import ProposerSetup
from verispec.proposers.prediction import build_for_request
from verispec.proposers.suffix_store import SuffixStore
from verispec.request import SpecRequest, Step, run_alone
from verispec.spec_text import parse_quant_source
from verispec.step.grammar import Constraint, ll_tokenizer
from verispec.step.processors import TokenLogprob, logprob_rows
from verispec.step.sampling import make_generator
from verispec.step.sequence import validate_prompt
from verispec.step.stopping import Stopper, held_back, trim_at_stop


@dataclass
class Result:
    text: str  # decoded output, cut before a stop string, special tokens skipped
    token_ids: list[int]  # generated ids; they end with the EOS or the stop-completing token
    stats: Stats
    finish_reason: str  # "stop" (EOS or a stop string) or "length"
    logprobs: list[TokenLogprob] | None = None  # one per token id, when sampling.logprobs is set

    def to_dict(self) -> dict:
        out = {"text": self.text, "token_ids": self.token_ids,
               "finish_reason": self.finish_reason, "stats": self.stats.to_dict()}
        if self.logprobs is not None:
            out["logprobs"] = [{"token": lp.token, "logprob": lp.logprob,
                                "top": [list(pair) for pair in lp.top]} for lp in self.logprobs]
        return out


@dataclass
class Chunk:
    token_ids: list[int]  # committed in this step
    text: str  # new text safe to show: never part of a stop string
    finish_reason: str | None
    stats: Stats
    logprobs: list[TokenLogprob] | None = None  # one per token id, when sampling.logprobs is set


@dataclass(frozen=True)
class ShownLogprob:
    """A token's logprob released with the text it starts in."""
    logprob: TokenLogprob
    offset: int  # where the token's text starts in the shown output


class TextDeltas:
    """Turns committed token blocks into text deltas safe to show: never part of
    a stop string, never half a UTF-8 character (held back until resolved).

    Logprobs pushed with the tokens are released with the text: a token's entry
    leaves once the shown text reaches past where the token starts, so nothing
    past a stop string is reported (vLLM #47616) and the EOS token, which adds no
    text, is never reported."""

    def __init__(self, decode, stops: tuple[str, ...]) -> None:
        self.decode = decode
        self.stops = stops
        self.ids: list[int] = []
        self.shown = 0
        self._waiting: list[ShownLogprob] = []
        self.released: list[ShownLogprob] = []  # every logprob shown so far, in order

    def push(self, tokens: list[int], final: bool,
             logprobs: list[TokenLogprob] | None = None) -> str:
        for i, token in enumerate(tokens):
            if logprobs is not None:
                offset = len(self.decode(self.ids)) if self.ids else 0
                self._waiting.append(ShownLogprob(logprobs[i], offset))
            self.ids.append(token)
        text = trim_at_stop(self.decode(self.ids), self.stops)
        safe = len(text)
        if not final:
            safe -= held_back(text, self.stops)
            while safe > self.shown and text[safe - 1] == "\ufffd":
                safe -= 1
        delta = text[self.shown:max(self.shown, safe)]
        self.shown = max(self.shown, safe)
        return delta

    def take_logprobs(self, final: bool = False) -> list[ShownLogprob]:
        """The logprobs whose tokens' text is now shown; at the end, the tokens
        that added no shown text (EOS, what a stop string cut) are dropped."""
        count = 0
        while count < len(self._waiting) and self._waiting[count].offset < self.shown:
            count += 1
        ready = self._waiting[:count]
        self._waiting = [] if final else self._waiting[count:]
        self.released.extend(ready)
        return ready


class Engine:
    def __init__(self, model: str | TargetModel | None = DEFAULT_MODEL, tokenizer=None,
                 dtype: str | torch.dtype | None = None, device: str | None = None,
                 backend: str = "auto", batch_invariant: bool = False,
                 weights: str = "auto") -> None:
        """`model`: a path (HF directory or .gguf), "default", or a TargetModel.
        `backend`: native (verispec's Llama-family forward), hf (transformers),
        or auto (native where supported). `weights` (GGUF files): quant-i8 runs the
        file's blocks on the kernels' integer path (int8 activations, as llama.cpp),
        quant with the dense bf16 logits, dense dequantizes them; auto = quant-i8
        where the CPU has AVX-512-VNNI or AVX-VNNI, else quant where the kernels build."""
        if isinstance(model, TargetModel):
            self.target = model
            self.tokenizer = tokenizer
            self.backend = "native" if isinstance(model, NativeLlama) else "hf"
            self.weights = getattr(model, "weights_kind", "dense")
            self.backend_note = ""
        else:
            loaded = load_target(model, backend=backend, dtype=dtype, device=device,
                                 batch_invariant=batch_invariant, weights=weights)
            self.target = loaded.target
            self.tokenizer = tokenizer or loaded.tokenizer
            self.backend = loaded.backend
            self.weights = loaded.weights
            self.backend_note = loaded.backend_note
        self._drafts: dict[str, TargetModel] = {}
        self._ll_tokenizer = None  # llguidance's view of the tokenizer, built on first use
        # Past outputs that `suffix` drafts from, shared by every request of this engine
        # (and so by every request a server runs); replace it to change its bounds.
        self.suffix_store = SuffixStore()

    # -- text edges ---------------------------------------------------------
    def encode(self, prompt: str, chat: bool = False) -> list[int]:
        """A raw prompt's ids, BOS/EOS added as the tokenizer asks; `chat`: through the template."""
        if chat:
            if not prompt or not prompt.strip():
                raise ValueError("the prompt is empty")
            return self.encode_messages([{"role": "user", "content": prompt}])
        return text_ids(self.tokenizer, prompt)

    def encode_messages(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """Token ids of a chat conversation, with the assistant's turn opened; `tools`
        (OpenAI's function list) for a chat template that writes them."""
        return chat_ids(self.tokenizer, messages, tools)

    def decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def token_text(self, token: int) -> str:
        """One token's own text, special tokens included (logprobs name them)."""
        if self.tokenizer is None:
            return f"<{token}>"
        return self.tokenizer.decode([token], skip_special_tokens=False)

    # -- drafts -------------------------------------------------------------
    def load_draft(self, source: str) -> TargetModel:
        """A draft model by path, `self:L` (the target's first L layers), or
        `quant:FMT[:L]` (the target's layers cast to a GGUF block format). Cached."""
        if source in self._drafts:
            return self._drafts[source]
        if source.startswith("quant:"):
            fmt, layers = parse_quant_source(source)
            if not isinstance(self.target, NativeLlama):
                raise ValueError(f"{self.target.name} cannot make a quantized self-draft "
                                 f"(it needs the native backend)")
            draft = quantized_draft(self.target, fmt, layers)
        elif source.startswith("self:"):
            layers = source.split(":", 1)[1]
            if not layers.isdigit():
                raise ValueError(f"self:L needs a whole number of layers, got {source!r}")
            if not hasattr(self.target, "truncated"):
                raise ValueError(f"{self.target.name} cannot make a layer-skip draft")
            draft = self.target.truncated(int(layers))
        else:
            loaded = load_target(source, backend="auto" if self.backend == "native" else "hf",
                                 dtype=self.target.dtype, device=str(self.target.device))
            draft = loaded.target
            self._check_vocab(draft, loaded.tokenizer, source)
        self._drafts[source] = draft
        return draft

    def _check_vocab(self, draft: TargetModel, draft_tokenizer, source: str) -> None:
        same_size = draft.vocab_size == self.target.vocab_size
        same_vocab = (self.tokenizer is None or draft_tokenizer is None
                      or draft_tokenizer.get_vocab() == self.tokenizer.get_vocab())
        if not (same_size and same_vocab):
            raise ValueError(
                f"draft {source} has a different vocabulary from the target "
                f"({draft.vocab_size} vs {self.target.vocab_size} rows"
                f"{'' if same_vocab else ', different token strings'}); "
                "speculative decoding needs a shared tokenizer")

    # -- generation ---------------------------------------------------------
    def _prompt_ids(self, prompt: str | list[int], chat: bool) -> list[int]:
        if isinstance(prompt, str):
            return self.encode(prompt, chat=chat)
        return [int(t) for t in prompt]

    def prediction_ids(self, prediction: str | list[int]) -> tuple[int, ...]:
        """A predicted output's ids (text through `prompt_ids.prediction_ids`)."""
        if isinstance(prediction, str):
            return tuple(prediction_ids(self.tokenizer, prediction))
        ids = tuple(int(t) for t in prediction)
        if ids and (min(ids) < 0 or max(ids) >= self.target.vocab_size):
            raise ValueError(f"prediction token ids must be in [0, {self.target.vocab_size})")
        return ids

    def new_request(self, ids: list[int], sampling: SamplingParams, spec: SpecConfig,
                    prediction: tuple[int, ...] | None = None) -> SpecRequest:
        """A step-wise request over token ids (see `request.SpecRequest`): what the
        single-request loop and the serving scheduler both drive. `prediction`: token
        ids the output is expected to repeat (OpenAI's Predicted Outputs), which draft
        first (proposers.prediction)."""
        validate_prompt(self.target, ids, sampling)
        check = getattr(self.target, "row_check", None)  # the CUDA path's start-up self-check
        if check is not None and not check.ok and spec.proposer != "none":
            raise ValueError(check.refusal())
        generator = make_generator(sampling.seed, self.target.device)
        proposer = build_for_request(ProposerSetup(
            self.target, spec, sampling, generator,
            {"load_draft": self.load_draft, "suffix_store": self.suffix_store},
            tuple(prediction or ())))
        decode = self.decode if self.tokenizer is not None else None
        stopper = Stopper(sampling, self.target.eos_token_ids, decode)
        label = spec.proposer if spec.proposer != "draft" else f"draft:{spec.draft}"
        stats = Stats(proposer=label, k=spec.k if spec.proposer != "none" else 0,
                      lossy=spec.lossy_typical and not sampling.greedy,
                      adaptive=spec.adaptive,
                      weights=weights_label(self.weights), backend=self.backend_note,
                      predicted=prediction is not None)
        return SpecRequest(self.target, ids, sampling, spec, proposer, stopper, generator, stats,
                           constraint=self.constraint(sampling, spec.grammar_forced))

    def constraint(self, sampling: SamplingParams,
                   draft_forced: bool = True) -> Constraint | None:
        """The request's grammar state (verispec.step.grammar), compiled for this tokenizer."""
        if sampling.grammar is None:
            return None
        if self.tokenizer is None:
            raise ValueError("a grammar needs the model's tokenizer")
        if self._ll_tokenizer is None:
            self._ll_tokenizer = ll_tokenizer(self.tokenizer, self.target.vocab_size)
        return Constraint(sampling.grammar, self._ll_tokenizer, self.target.vocab_size,
                          draft_forced=draft_forced)

    def _steps(self, prompt: str | list[int], sampling: SamplingParams, spec: SpecConfig,
               chat: bool, prediction: str | list[int] | None) -> tuple[Iterator[Step], Stats]:
        predicted = self.prediction_ids(prediction) if prediction is not None else None
        request = self.new_request(self._prompt_ids(prompt, chat), sampling, spec, predicted)
        return run_alone(self.target, request), request.stats

    def stream(self, prompt: str | list[int], sampling: SamplingParams | None = None,
               spec: SpecConfig | None = None, chat: bool = False,
               prediction: str | list[int] | None = None) -> Iterator[Chunk]:
        """Yield tokens as they are committed, with text deltas that never show a stop
        string. `prediction`: text (or token ids) the output is expected to repeat."""
        sampling = sampling or SamplingParams()
        steps, stats = self._steps(prompt, sampling, spec or DEFAULT_SPEC, chat, prediction)
        deltas = TextDeltas(self.decode, sampling.stop)
        for step in steps:
            delta = deltas.push(step.tokens, final=bool(step.finish_reason))
            yield Chunk(step.tokens, delta, step.finish_reason, stats, step.logprobs)

    def generate(self, prompt: str | list[int], sampling: SamplingParams | None = None,
                 spec: SpecConfig | None = None, chat: bool = False,
                 prediction: str | list[int] | None = None) -> Result:
        """`prediction` (OpenAI's Predicted Outputs): text or token ids the output is
        expected to repeat, such as the file an edit starts from; it drafts first, and
        `result.stats` counts its accepted and rejected tokens. The output is unchanged."""
        sampling = sampling or SamplingParams()
        steps, stats = self._steps(prompt, sampling, spec or DEFAULT_SPEC, chat, prediction)
        ids: list[int] = []
        logprobs: list[TokenLogprob] | None = [] if sampling.logprobs is not None else None
        for step in steps:
            ids.extend(step.tokens)
            if logprobs is not None:
                logprobs.extend(step.logprobs)
        text = trim_at_stop(self.decode(ids), sampling.stop)
        return Result(text, ids, stats, stats.finish_reason or "length", logprobs)

    def prompt_logprobs(self, ids: list[int], top: int = 0) -> list[TokenLogprob | None]:
        """Each prompt token's logprob under the target given the tokens before it
        (None for the first), and the `top` best: OpenAI's echo with logprobs.
        The target's raw distribution: the request's processors and temperature
        shape what it generates, not what it was given."""
        if len(ids) < 2:
            return [None] * len(ids)
        cache = self.target.new_cache(capacity=len(ids))
        with torch.no_grad():
            logits = self.target.forward(torch.tensor(ids[:-1]), cache,
                                         num_logits=len(ids) - 1).logits  # [n - 1, vocab]
        rows = logprob_rows(logits, SamplingParams())  # [n - 1, vocab]
        picked = rows.gather(-1, torch.tensor(ids[1:], device=rows.device)[:, None])
        picked = picked.squeeze(-1).tolist()
        tops = rows.topk(top, dim=-1) if top else None
        top_ids = tops.indices.tolist() if top else [[]] * len(picked)  # one read each
        top_values = tops.values.tolist() if top else [[]] * len(picked)
        out: list[TokenLogprob | None] = [None]
        for token, value, ids_i, values_i in zip(ids[1:], picked, top_ids, top_values):
            out.append(TokenLogprob(token, value, tuple(zip(ids_i, values_i))))
        return out
