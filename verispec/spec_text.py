"""What users type about speculation, turned into a `SpecConfig` in one place.

Every edge reads user text through `parse_spec`: `verispec generate` flags,
`verispec serve` defaults, the HTTP `speculation` object and `verispec bench`'s
proposer tokens (`ngram+tree=16+head=DIR`, `self:8`, via `parse_token`). The
edges only gather the typed values into a mapping keyed by `FIELDS`, so a
spelling accepted in one place is accepted in all of them.

Typed forms (strings as typed, or already-typed numbers):
  proposer   a registered name (ngram, suffix, lookahead, draft, eagle, medusa, auto, none) or a
             draft source (`self:L`), which means proposer draft with that draft
  k          a whole number (fixed), or `auto`: chosen per step, capped by k_max
  tree       a whole number (node budget), or `k` (as many nodes as k)
  draft      a model path or a draft source (`DRAFT_SOURCES`)

Extending it: a new proposer registers itself in `verispec.proposers` and is
accepted here by name; a new option is one entry in `FIELDS` (its default, and
the `SpecConfig` field it fills if the names differ); a new draft source (such as
a quantized self-draft) is one entry in `DRAFT_SOURCES`, after which it works as
`--draft SRC`, as a bench token and as a proposer shorthand everywhere.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

from .config import SpecConfig


class SpecError(ValueError):
    """A user error in speculation text; `field` names what was wrong (a FIELDS key)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def _check_self(rest: str) -> None:
    if not rest.isdigit() or int(rest) < 1:
        raise SpecError(f"self:L needs a whole number of layers >= 1, got self:{rest}", "draft")


DRAFT_FORMATS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")  # the gguf package can quantize these


def parse_quant_source(source: str) -> tuple[str, int | None]:
    """`quant:FMT` or `quant:FMT:L` (the target's layers cast to a GGUF block
    format, models.quant_draft) -> (FMT, L or None)."""
    parts = source.split(":")
    if len(parts) not in (2, 3) or parts[0] != "quant":
        raise SpecError(f"a quantized self-draft is quant:FORMAT or quant:FORMAT:L, got {source!r}",
                        "draft")
    fmt = parts[1].upper()
    if fmt not in DRAFT_FORMATS:
        raise SpecError(f"quant:FORMAT takes one of {', '.join(DRAFT_FORMATS)}, got {parts[1]!r}",
                        "draft")
    if len(parts) == 3 and (not parts[2].isdigit() or int(parts[2]) < 1):
        raise SpecError(f"quant:{fmt}:L needs a whole number of layers >= 1, got {parts[2]!r}",
                        "draft")
    return fmt, int(parts[2]) if len(parts) == 3 else None


# Draft sources named by a prefix: `prefix:rest`, checked by the validator of rest.
# Bounds that need the model (L <= its layer count) are checked where it is loaded.
DRAFT_SOURCES: dict[str, Callable[[str], None]] = {
    "self": _check_self,
    "quant": lambda rest: parse_quant_source(f"quant:{rest}") and None,
}

# Every field a user may type, with its default when not typed. Fields named like a
# SpecConfig field fill it; k_max is the cap of k=auto.
FIELDS: dict[str, Any] = {
    "proposer": "ngram", "k": "auto", "k_max": 8, "tree": 0,
    "tree_shape": SpecConfig.tree_shape, "tree_branch": SpecConfig.tree_branch,
    "draft": None, "profile": None, "ngram_min": SpecConfig.ngram_min,
    "ngram_max": SpecConfig.ngram_max, "head": None, "head_vocab": SpecConfig.head_vocab,
    "head_quant": None,
    "lossy_typical": False, "suffix_factor": SpecConfig.suffix_factor,
    "suffix_offset": SpecConfig.suffix_offset, "suffix_min_prob": SpecConfig.suffix_min_prob,
    "lookahead_window": SpecConfig.lookahead_window, "lookahead_ngram": SpecConfig.lookahead_ngram,
    "lookahead_guesses": SpecConfig.lookahead_guesses,
    "frequency_drafts": SpecConfig.frequency_drafts,
    "grammar_forced": SpecConfig.grammar_forced,
}
_DERIVED = {"proposer", "k", "k_max", "tree", "draft"}  # not copied verbatim
HEAD_PROPOSERS = ("eagle", "medusa")  # the proposers that read a head directory


def draft_source(text: str) -> str | None:
    """The prefix of a draft source (`self` for `self:8`), or None for a path."""
    prefix, sep, rest = text.partition(":")
    if not sep or prefix not in DRAFT_SOURCES:
        return None
    DRAFT_SOURCES[prefix](rest)
    return prefix


def _whole(value: Any, name: str, also: str = "") -> int:
    takes = f"--{name.replace('_', '-')} takes a whole number{' or ' + also if also else ''}"
    if isinstance(value, bool):
        raise SpecError(f"{takes}, got {value!r}", name)
    if isinstance(value, int):
        return value
    try:
        return int(str(value))
    except ValueError:
        raise SpecError(f"{takes}, got {value!r}", name) from None


def _number(value: Any, name: str) -> float:
    try:
        if isinstance(value, bool):
            raise ValueError
        return float(value)
    except (TypeError, ValueError):
        raise SpecError(f"--{name.replace('_', '-')} takes a number, got {value!r}", name) from None


def _flag(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    word = str(value).lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise SpecError(f"{name} is on or off (1/0, true/false), got {value!r}", name)


def proposer_names() -> list[str]:
    from . import proposers

    return proposers.available()


def parse_spec(typed: Mapping[str, Any] | None = None, **more: Any) -> SpecConfig:
    """The SpecConfig for typed values keyed by `FIELDS` (None = not typed). Raises
    SpecError (a ValueError) naming the field at fault."""
    values = dict(FIELDS)
    for key, value in {**(typed or {}), **more}.items():
        if key not in FIELDS:
            raise SpecError(f"unknown speculation setting {key!r}; known: "
                            f"{', '.join(FIELDS)}", key)
        if value is not None:
            values[key] = value
    proposer, draft = str(values["proposer"]), values["draft"]
    if draft_source(proposer):
        proposer, draft = "draft", proposer
    if proposer not in proposer_names():
        raise SpecError(f"unknown proposer {proposer!r}; choose {', '.join(proposer_names())} "
                        f"or a draft source ({', '.join(p + ':...' for p in DRAFT_SOURCES)})",
                        "proposer")
    if draft is not None:
        draft_source(str(draft))
    if proposer == "draft" and not draft:
        raise SpecError("proposer 'draft' needs a draft: --draft PATH or self:L", "draft")
    if values["head"] is not None and proposer not in HEAD_PROPOSERS:
        raise SpecError(f"a head directory needs a trained-head proposer "
                        f"({', '.join(HEAD_PROPOSERS)}), not {proposer!r}", "head")
    for key in _FLOATS:
        values[key] = _number(values[key], key)
    for key in _NUMBERS - _DERIVED:
        values[key] = _whole(values[key], key)
    for key in _BOOLS:
        values[key] = _flag(values[key], key)
    common = {key: values[key] for key in FIELDS if key not in _DERIVED}
    k_auto = str(values["k"]) == "auto"
    k = _whole(values["k_max"] if k_auto else values["k"], "k_max" if k_auto else "k", "auto")
    tree = k if str(values["tree"]) == "k" else _whole(values["tree"], "tree", "k")
    if proposer == "none":
        return _config(proposer="none", k=0, **common)
    return _config(proposer=proposer, k=k, draft=draft, adaptive=k_auto, tree=tree, **common)


def _config(**fields: Any) -> SpecConfig:
    try:
        return SpecConfig(**fields)
    except ValueError as exc:
        # SpecConfig's messages open with the field they are about.
        first = str(exc).split(" ", 1)[0]
        field = first if first in FIELDS else "tree" if first.startswith("tree") else None
        if first == "lookahead":  # "lookahead needs lookahead_window >= 1, ...": the first bad one
            field = next((name for name, low in _LOOKAHEAD_LOWEST.items()
                          if fields.get(name, low) < low), None)
        raise SpecError(str(exc), field) from None


def parse_token(token: str, base: Mapping[str, Any] | None = None) -> SpecConfig:
    """A proposer token: a proposer (or draft source) with `+` modifiers, each
    `+NAME=VALUE` for a FIELDS key (`-` may stand for `_`), or `+auto` for k=auto
    capped at the base k. `base`: the typed values the token modifies (bench's
    --k and --draft). `self:4+auto`, `ngram+tree=16`, `eagle+head=runs/new+tree=k`."""
    name, *modifiers = token.split("+")
    values = {**(base or {}), "proposer": name}
    for modifier in modifiers:
        key, sep, value = modifier.partition("=")
        key = key.replace("-", "_")
        if modifier == "auto":
            if str(values.get("k", "auto")) != "auto":
                values["k_max"] = values["k"]
            values["k"] = "auto"
        elif sep and value and key in FIELDS and key not in ("proposer", "k_max"):
            values[key] = int(value) if key in _NUMBERS and value.isdigit() else value
        else:
            raise SpecError(f"proposer {token!r}: unknown modifier {modifier!r}; use +auto, "
                            f"+tree=N|k, +head=DIR or +NAME=VALUE for a setting in "
                            f"{', '.join(FIELDS)}", "proposer")
    try:
        return parse_spec(values)
    except SpecError as exc:
        raise SpecError(f"proposer {token!r}: {exc}", exc.field) from None


_FLOATS = {key for key, default in FIELDS.items() if type(default) is float}
# Fields whose modifier text is a number (k and tree keep their words: auto, k).
_NUMBERS = {key for key, default in FIELDS.items()
            if type(default) is int and key not in ("k", "tree")}
_BOOLS = {key for key, default in FIELDS.items() if type(default) is bool}
_LOOKAHEAD_LOWEST = {"lookahead_window": 1, "lookahead_ngram": 2, "lookahead_guesses": 0}
