"""Logprobs in OpenAI's two response shapes, from the engine's `TokenLogprob`s.

Chat: `{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}],
"refusal": null}`. Completions (legacy): `{"tokens", "token_logprobs",
"top_logprobs", "text_offset"}`, with the prompt's tokens first under echo
(the first prompt token has no logprob: null, as OpenAI writes it).
A logprob of -inf (a token a processor forbade, e.g. EOS under min_tokens) is
written -9999.0, OpenAI's own floor, since JSON has no infinity.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

from verispec.api import ShownLogprob
from verispec.serving.responses import ChatLogprobs, CompletionLogprobs, TopLogprob
from verispec.serving.responses import TokenLogprob as TokenEntry
from verispec.step.processors import TokenLogprob

FLOOR = -9999.0
TokenText = Callable[[int], str]


def _finite(value: float) -> float:
    return value if math.isfinite(value) else FLOOR


def _entry(text: TokenText, token: int, logprob: float) -> dict:
    word = text(token)
    return {"token": word, "logprob": _finite(logprob),
            "bytes": list(word.encode("utf-8", "surrogatepass"))}


def chat_content(text: TokenText, shown: Sequence[ShownLogprob]) -> list[TokenEntry]:
    """The `content` list of a chat choice's (or chunk's) logprobs."""
    return [TokenEntry(**_entry(text, item.logprob.token, item.logprob.logprob),
                       top_logprobs=[TopLogprob(**_entry(text, t, v)) for t, v in item.logprob.top])
            for item in shown]


def chat_logprobs(text: TokenText, shown: Sequence[ShownLogprob]) -> ChatLogprobs:
    return ChatLogprobs(content=chat_content(text, shown), refusal=None)


def completion_logprobs(text: TokenText, shown: Sequence[ShownLogprob], base_offset: int = 0,
                        prompt: Sequence[TokenLogprob | None] = (),
                        prompt_ids: Sequence[int] = (),
                        prompt_offsets: Sequence[int] = ()) -> CompletionLogprobs:
    """Legacy completions logprobs; `base_offset`: where the generated text starts in
    the returned text (the echoed prompt's length); prompt*: echo's entries."""
    tokens, values, tops, offsets = [], [], [], []
    for token, lp, offset in zip(prompt_ids, prompt, prompt_offsets):
        tokens.append(text(token))
        values.append(None if lp is None else _finite(lp.logprob))
        tops.append(None if lp is None else {text(t): _finite(v) for t, v in lp.top})
        offsets.append(offset)
    for item in shown:
        lp = item.logprob
        tokens.append(text(lp.token))
        values.append(_finite(lp.logprob))
        tops.append({text(t): _finite(v) for t, v in lp.top})
        offsets.append(base_offset + item.offset)
    return CompletionLogprobs(tokens=tokens, token_logprobs=values, top_logprobs=tops,
                              text_offset=offsets)
