"""Frozen, validated request settings. Every field is checked at construction,
so a bad value fails with a ValueError before any model work starts."""
from __future__ import annotations

import json
from dataclasses import dataclass

TREE_SHAPES = ("dynamic", "topb")  # shapes of model-drafted trees (verispec.proposers.tree_drafting)
SUFFIX_STORE_TOKENS = 1 << 18  # the global suffix store's default bound in cached tokens
SUFFIX_STORE_REQUESTS = 4096  # ... and in cached outputs
HEAD_QUANTS = ("Q8_0", "Q4_0")  # block formats an EAGLE head's matrices may run in
JSON_WHITESPACE = r"[ \n]{0,24}"  # between JSON tokens: room for indented output, not for ever
GRAMMAR_KINDS = ("json_object", "json_schema", "regex", "lark")


@dataclass(frozen=True)
class Grammar:
    """What the output must match: a JSON schema (JSON text), any JSON object,
    a regular expression, or a Lark grammar (llguidance's dialect)."""
    kind: str
    source: str = ""

    def __post_init__(self) -> None:
        if self.kind not in GRAMMAR_KINDS:
            raise ValueError(f"grammar kind must be one of {', '.join(GRAMMAR_KINDS)}, got {self.kind!r}")
        if self.kind != "json_object" and not self.source:
            raise ValueError(f"a {self.kind} grammar needs its source text")

    def llguidance(self) -> str:
        """The grammar in llguidance's own format."""
        import llguidance  # the grammar engine (verispec.grammar says why)

        # JSON whitespace is bounded: a weak model can otherwise loop on blank space
        # for ever inside a flexible-whitespace grammar and never close the object.
        options = {"whitespace_pattern": JSON_WHITESPACE}
        if self.kind == "json_object":
            return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"},
                                                                 defaults=options)
        if self.kind == "json_schema":
            return llguidance.LLMatcher.grammar_from_json_schema(json.loads(self.source),
                                                                 defaults=options)
        if self.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(self.source)
        return llguidance.LLMatcher.grammar_from_lark(self.source)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy (argmax); > 0 samples from softmax(logits / T)
    top_k: int = 0  # keep the k most likely tokens; 0 disables
    top_p: float = 1.0  # nucleus mass in (0, 1]; 1 disables
    seed: int | None = None  # seeds the request's own torch.Generator; None draws a fresh seed
    max_new_tokens: int = 128  # hard cap on generated tokens, enforced inside an accepted block
    stop: tuple[str, ...] = ()  # stop strings; output ends at the token that completes one
    ignore_eos: bool = False  # keep generating past EOS (benchmarks of fixed length)
    # Logit processing (verispec.processors), applied to the target at every verified
    # row with that row's own prefix, so it holds under speculation exactly as in plain decoding.
    presence_penalty: float = 0.0  # OpenAI: minus this from a token already in the output
    frequency_penalty: float = 0.0  # OpenAI: minus this times the token's count in the output
    repetition_penalty: float = 1.0  # CTRL / HF: logits of tokens in prompt or output
    # divided by it when positive, multiplied when negative; 1 disables
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) pairs; a dict is accepted
    min_p: float = 0.0  # drop tokens with probability under min_p times the top one's; 0 disables
    min_tokens: int = 0  # EOS is impossible before this many tokens are generated
    logprobs: int | None = None  # None: none; N: the emitted token's logprob and the N best
    grammar: Grammar | None = None  # the output must match it (verispec.grammar)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        bias = self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias
        object.__setattr__(self, "logit_bias", tuple(sorted((int(t), float(b)) for t, b in bias)))
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not 0 < self.repetition_penalty <= 10:
            raise ValueError(f"repetition_penalty must be in (0, 10], got {self.repetition_penalty}")
        if any(t < 0 or not -100 <= b <= 100 for t, b in self.logit_bias):
            raise ValueError("logit_bias needs token ids >= 0 and biases in [-100, 100]")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise ValueError(f"logprobs must be None or in [0, 20], got {self.logprobs}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class SpecConfig:
    proposer: str = "ngram"  # registry name: ngram, draft, eagle, medusa, none (verispec.proposers)
    k: int = 4  # draft tokens per step; 0 means plain decoding; with adaptive, the cap
    adaptive: bool = False  # choose k per step to maximize expected tokens/s (verispec.policy)
    profile: str | None = None  # cost profile JSON from `verispec profile`, a prior for adaptive
    draft: str | None = None  # for proposer=draft: a model path, or "self:L" for a layer-skip draft
    tree: int = 0  # node budget for tree drafts (verified in one pass); 0 drafts a chain
    tree_shape: str = "dynamic"  # model-drafted trees: "dynamic" (EAGLE-2: best cumulative
    # draft probability) or "topb" (every node's tree_branch best children, breadth-first)
    tree_branch: int = 4  # children per expanded node (and expanded nodes per depth, dynamic)
    ngram_min: int = 1  # shortest suffix the n-gram proposer tries to match
    ngram_max: int = 4  # longest suffix it tries first
    head: str | None = None  # for proposer=eagle|medusa: a head directory; None = the shipped one
    head_vocab: int = 8192  # heads draft over at most this many tokens: the lowest ids of the
    # head's draft vocabulary (BPE numbers tokens in merge order, frequent first); 0 = all
    head_quant: str | None = None  # EAGLE: the head's matrices in this GGUF block format
    # (Q8_0, Q4_0) for fewer bytes per draft step; None = as trained (bf16)
    lossy_typical: bool = False  # sampled runs: Medusa typical acceptance, LOSSY (Cai et al. 2024)
    suffix_factor: float = 1.0  # suffix: draft depth at most suffix_factor * match length
    suffix_offset: float = 0.0  # ... plus this (max_spec_factor, max_spec_offset of SuffixDecoding)
    suffix_min_prob: float = 0.1  # suffix: extend a path while its frequency-based probability >= this
    lookahead_window: int = 1  # lookahead: W, Jacobi columns (Fu et al. 2024; docs/lookahead.md)
    lookahead_ngram: int = 2  # ... N, n-gram length (the window keeps N - 1 levels)
    lookahead_guesses: int = 2  # ... G, pool n-grams verified per step
    frequency_drafts: bool = False  # ngram / suffix chains of a sampled request: each draft
    # token drawn from the continuation frequencies, verified against them (docs/sampling.md)
    grammar_forced: bool = True  # under a grammar, draft the tokens it forces first (one-hot);
    # off only to measure what they bring (docs/structured_outputs.md)

    def __post_init__(self) -> None:
        if self.k < 0:
            raise ValueError(f"k must be >= 0, got {self.k}")
        if self.tree < 0:
            raise ValueError(f"tree node budget must be >= 0, got {self.tree}")
        if self.tree_shape not in TREE_SHAPES:
            raise ValueError(f"tree_shape must be one of {', '.join(TREE_SHAPES)}, "
                             f"got {self.tree_shape!r}")
        if self.head_vocab < 0:
            raise ValueError(f"head_vocab must be >= 0 (0 = the head's whole draft vocabulary), "
                             f"got {self.head_vocab}")
        if self.head_quant is not None and self.head_quant not in HEAD_QUANTS:
            raise ValueError(f"head_quant must be one of {', '.join(HEAD_QUANTS)} or None, "
                             f"got {self.head_quant!r}")
        if self.tree_branch < 1:
            raise ValueError(f"tree_branch must be >= 1, got {self.tree_branch}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(
                f"need 1 <= ngram_min <= ngram_max, got {self.ngram_min}, {self.ngram_max}")
        if self.suffix_factor < 0 or not 0 <= self.suffix_min_prob <= 1:
            raise ValueError(f"suffix_factor must be >= 0 and suffix_min_prob in [0, 1], got "
                             f"{self.suffix_factor}, {self.suffix_min_prob}")
        if self.lookahead_window < 1 or self.lookahead_ngram < 2 or self.lookahead_guesses < 0:
            raise ValueError(f"lookahead needs lookahead_window >= 1, lookahead_ngram >= 2 and "
                             f"lookahead_guesses >= 0, got {self.lookahead_window}, "
                             f"{self.lookahead_ngram}, {self.lookahead_guesses}")
        if self.proposer == "lookahead" and not self.tree:
            # Lookahead always drafts a tree (window and guesses in one forward): tree 0
            # means its whole step, so the request's cache makes room for it.
            object.__setattr__(self, "tree", (self.lookahead_window + self.lookahead_guesses)
                               * (self.lookahead_ngram - 1))
        if self.lossy_typical and self.tree:
            raise ValueError("lossy_typical verifies chains; it cannot be combined with a tree")
        if self.proposer == "draft" and not self.draft:
            raise ValueError("proposer 'draft' needs a draft model: a path or self:L")


# What runs when no SpecConfig is given (Engine.generate/stream and `verispec generate`;
# `verispec serve` defaults to the same): n-gram lookup with k chosen per step, up to 8.
# Why: no fixed k is best on every workload, and adaptive k keyed on n-gram lookup's match
# length stays close to the best one on each (docs/benchmarks.md, the clock-free replay).
# A SpecConfig built by hand keeps k = 4, fixed.
DEFAULT_SPEC = SpecConfig(proposer="ngram", k=8, adaptive=True)
