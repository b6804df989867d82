"""Where each streamed token came from: the `include_provenance` stream extension.

A client that sends `"stream_options": {"include_provenance": true}` gets, in
every chunk of a choice, one `provenance` object per target pass (one engine
step), next to the usual `delta` / `text`:

    "provenance": {
      "step": 7,             # this choice's target pass, from 1
      "k": 4,                # draft length asked for (0 = a plain step)
      "drafted": 4,          # drafts verified (a tree step: its node count)
      "accepted": 2,         # of those, kept by the verifier
      "tokens": [            # committed by this pass, in order
        {"id": 311, "text": " the", "origin": "accepted"},
        {"id": 1045, "text": " cat", "origin": "accepted"},
        {"id": 28, "text": ",", "origin": "recovered"}],
      "rejected": [          # drafts the verifier discarded, the rejected one first
        {"id": 30, "text": "."}, {"id": 198, "text": "\\n"}]}

Origins follow the rejection sampler's glossary (verispec.step.rejection):
`accepted` (a draft the verifier kept), `recovered` (resampled at the first
rejection; greedy: the target's argmax there) and `bonus` (the target's own
token after every draft passed; on a k = 0 step it is the plain token). A stop
(EOS, a stop string, max_tokens) may cut a pass's tokens short, and then no
recovered or bonus token follows. The `text` of the committed tokens
concatenates to the decoded completion; a token that ends inside a UTF-8
character has "" and the next one carries it. A request with stop strings is
refused (protocol.build_job): token texts stream per pass, ahead of the
text the server holds back for a partial stop string, and would show what the
stop trims.
The origins are the engine's own verdicts (metrics.StepRecord), not a replay.
"""
from __future__ import annotations

import os
from typing import Callable

from verispec.metrics import StepRecord

ACCEPTED, RECOVERED, BONUS = "accepted", "recovered", "bonus"
_CONTEXT = 16  # committed tokens decoded in front of a rejected draft, for its spacing


def origins(record: StepRecord, emitted: int) -> list[str]:
    """The origin of each of a step's `emitted` committed tokens."""
    last = BONUS if record.bonus else RECOVERED
    return [ACCEPTED if i < record.accepted else last for i in range(emitted)]


class ChoiceProvenance:
    """One choice's provenance objects, step by step."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self.decode = decode
        self.ids: list[int] = []
        self.shown = ""  # text attributed to tokens so far
        self.steps = 0

    def step(self, record: StepRecord, tokens: list[int], final: bool) -> dict:
        self.steps += 1
        before = len(self.ids)
        entries = []
        for i, (token, origin) in enumerate(zip(tokens, origins(record, len(tokens)))):
            entries.append({"id": int(token), "text": self._push(token, final and i == len(tokens) - 1),
                            "origin": origin})
        # The chain's rejected drafts continue the accepted ones; a tree's are siblings.
        context = self.ids[max(0, before - _CONTEXT):before + record.accepted]
        return {"step": self.steps, "k": record.k, "drafted": record.drafted,
                "accepted": record.accepted, "tokens": entries,
                "rejected": [{"id": int(t), "text": self._alone(context, t)} for t in record.rejected]}

    def _push(self, token: int, final: bool) -> str:
        self.ids.append(token)
        text = self.decode(self.ids)
        if not final:
            text = text.rstrip("\ufffd")  # half a UTF-8 character: the next token carries it
        # Decoding is prefix-stable for byte-level and SentencePiece vocabularies; should a
        # tokenizer rewrite earlier text, the new token gets what follows the common part.
        start = len(os.path.commonprefix([self.shown, text]))
        piece, self.shown = text[start:], text
        return piece

    def _alone(self, context: list[int], token: int) -> str:
        head = self.decode(context)
        text = self.decode([*context, token])
        return text[len(head):] if text.startswith(head) else self.decode([token])
