"""When generation ends. Checked after every committed token, so EOS, a stop
string or max_new_tokens that falls inside an accepted block ends the output
right there (transformers #31301, #48039; SGLang #31599)."""
from __future__ import annotations

from typing import Callable

from verispec.config import SamplingParams

Decode = Callable[[list[int]], str]


class Stopper:
    def __init__(self, sampling: SamplingParams, eos_token_ids: frozenset[int],
                 decode: Decode | None = None) -> None:
        if sampling.stop and decode is None:
            raise ValueError("stop strings need a tokenizer to decode the output")
        self.sampling = sampling
        self.eos = frozenset() if sampling.ignore_eos else eos_token_ids
        self.decode = decode
        longest = max((len(s) for s in sampling.stop), default=0)
        # Every token decodes to at least one character or a partial one, so a
        # window this long always covers a stop string completed by its last token.
        self.window = 2 * longest + 8

    def check(self, generated: list[int]) -> str | None:
        """The finish reason after appending generated[-1], or None to go on."""
        if generated[-1] in self.eos:
            return "stop"
        if self.sampling.stop and self.decode is not None:
            tail = self.decode(generated[-self.window:])
            if any(s in tail for s in self.sampling.stop):
                return "stop"
        if len(generated) >= self.sampling.max_new_tokens:
            return "length"
        return None


def trim_at_stop(text: str, stops: tuple[str, ...]) -> str:
    """The text before the earliest stop string (OpenAI semantics: the stop is not returned)."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return text if cut < 0 else text[:cut]


def held_back(text: str, stops: tuple[str, ...]) -> int:
    """How many trailing characters of streamed text might start a stop string
    and so must not be shown yet."""
    hold = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), hold, -1):
            if text.endswith(stop[:n]):
                hold = n
                break
    return hold
