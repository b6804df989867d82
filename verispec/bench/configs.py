"""Which configurations a benchmark runs: verispec's, from the proposer tokens users type
(`none,ngram+auto,eagle+tree=16`, a k sweep, `+prediction`), and the peers' names beside
them. The runs themselves are verispec.bench.runner's."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from verispec.config import SpecConfig
from verispec.spec_text import parse_token

VERISPEC = "verispec"
PEER = "peer"


@dataclass(frozen=True)
class BenchConfig:
    """One column of the benchmark: a verispec SpecConfig or a named peer.

    A new proposer needs no change here: it is a registry name inside a
    SpecConfig, and its options are SpecConfig fields (verispec.spec_text).
    """
    label: str  # unique within a run; the report's row name
    kind: str  # VERISPEC or PEER
    name: str  # the proposer token the user typed (ngram, self:8, none) or the peer name
    k: int = 0
    spec: SpecConfig | None = None  # set when kind == VERISPEC
    peer: str | None = None  # set when kind == PEER
    # Set for a peer that computes with other weights (llama.cpp on the quantized
    # GGUF): the label of its own plain run, the only output it is compared with.
    own_reference: str | None = None
    prediction: bool = False  # `+prediction`: send each prompt's predicted output, if any

    @property
    def is_plain(self) -> bool:
        """verispec's own plain loop: the reference of the greedy-equality check."""
        return self.kind == VERISPEC and self.spec is not None and self.spec.proposer == "none"

    @property
    def speculative(self) -> bool:
        return self.kind == VERISPEC and not self.is_plain


def parse_k_list(text: str) -> list[int]:
    """`1..10`, `1,2,4,8` or a mix (`1..4,8`) -> sorted distinct k values >= 1."""
    values: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            if ".." in part:
                low, high = (int(x) for x in part.split("..", 1))
                if low > high:
                    raise ValueError
                values.update(range(low, high + 1))
            else:
                values.add(int(part))
        except ValueError:
            raise ValueError(f"--sweep-k: cannot read {part!r}; write e.g. 1..10 or 1,2,4,8") from None
    if not values:
        raise ValueError(f"--sweep-k: no k in {text!r}")
    if min(values) < 1:
        raise ValueError(f"--sweep-k: k must be >= 1, got {min(values)}")
    return sorted(values)


def proposer_spec(token: str, k: int, draft: str | None) -> SpecConfig:
    """The SpecConfig a bench proposer token stands for (`verispec.spec_text.parse_token`):
    `ngram+tree=16`, `self:4+auto`, `eagle+head=runs/new` (two heads side by side), at
    the bench's k (the cap of `+auto`) and its --draft."""
    return parse_token(token, {"k": k, "draft": draft})


PREDICTION = "+prediction"  # a token's modifier: the prompts' predicted outputs draft first


def verispec_configs(text: str, k: int, draft: str | None,
                     sweep: Sequence[int] | None = None) -> list[BenchConfig]:
    """Configs for `--proposer none,ngram,self:8`; with a sweep every
    speculative proposer runs at each k instead of at `k`, except adaptive
    ones (`+auto`), which choose k themselves: they run once, capped at the
    sweep's largest k, to be compared with the best static k. A token ending in
    `+prediction` sends each prompt's predicted output (proposers.prediction)."""
    if k < 1:
        raise ValueError(f"--k must be >= 1, got {k} (use --proposer none for plain decoding)")
    tokens: list[str] = []
    for token in (t.strip() for t in text.split(",")):
        if token and token not in tokens:
            tokens.append(token)
    if not tokens:
        raise ValueError(f"--proposer: no proposer named in {text!r}")
    configs: list[BenchConfig] = []
    for token in tokens:
        predicted = token.endswith(PREDICTION)
        name = token[:-len(PREDICTION)] if predicted else token
        spec = proposer_spec(name, k, draft)
        if spec.proposer == "none":
            if predicted:
                raise ValueError(f"--proposer {token}: plain decoding drafts nothing, so it "
                                 "has no use for a prediction; give a proposer (ngram+prediction)")
            configs.append(BenchConfig(token, VERISPEC, token, 0, proposer_spec(token, 0, draft)))
            continue
        for kk in ([max(sweep)] if sweep and spec.adaptive else (sweep or [k])):
            label = f"{token} k={kk}" if sweep and not spec.adaptive else token
            configs.append(BenchConfig(label, VERISPEC, token, kk, proposer_spec(name, kk, draft),
                                       prediction=predicted))
    return configs
