"""OpenAI response bodies as pydantic models: completions, chat completions
and their streamed chunks, with verispec's `speculation` (and, on request,
`provenance`) extensions.

They are serialized with `exclude_unset`: a field appears exactly when the
code that builds a body sets it, so OpenAI's explicit nulls (`"logprobs":
null`, `"finish_reason": null`, a streamed `"usage": null`) are written and
the extensions are left out where a body does not carry them.
"""
from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel


class Body(BaseModel):
    def dump(self) -> dict:
        return self.model_dump(mode="json", exclude_unset=True)

    def sse(self) -> str:
        return f"data: {self.model_dump_json(exclude_unset=True)}\n\n"


class SpeculationStats(Body):
    """verispec: how speculation went for a choice, or for the whole request."""
    proposer: str
    drafted: int
    accepted: int
    acceptance_rate: float
    tau: float  # tokens per target forward
    target_forwards: int


class CompletionTokensDetails(Body):
    """Sent with a predicted output: its drafts the verifier kept and discarded
    (verispec has no reasoning or audio tokens)."""
    accepted_prediction_tokens: int
    rejected_prediction_tokens: int
    reasoning_tokens: int
    audio_tokens: int


class Usage(Body):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    completion_tokens_details: Optional[CompletionTokensDetails] = None


class TopLogprob(Body):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(Body):
    content: list[TokenLogprob]
    refusal: Optional[str]


class CompletionLogprobs(Body):
    """The legacy shape; the first echoed prompt token has no logprob (null)."""
    tokens: list[str]
    token_logprobs: list[Optional[float]]
    top_logprobs: list[Optional[dict[str, float]]]
    text_offset: list[int]


class FunctionCall(Body):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(Body):
    index: Optional[int] = None  # in a streamed delta
    id: str
    type: Literal["function"]
    function: FunctionCall


class ChatMessage(Body):
    role: Literal["assistant"]
    content: Optional[str]
    tool_calls: Optional[list[ToolCall]] = None


class ChatChoice(Body):
    index: int
    message: ChatMessage
    logprobs: Optional[ChatLogprobs]
    finish_reason: Optional[str]
    speculation: Optional[SpeculationStats] = None


class ChatCompletion(Body):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    speculation: Optional[SpeculationStats] = None


class CompletionChoice(Body):
    index: int
    text: str
    logprobs: Optional[CompletionLogprobs]
    finish_reason: Optional[str]
    speculation: Optional[SpeculationStats] = None
    provenance: Optional[dict[str, Any]] = None  # streamed, on request (serving.provenance)


class Completion(Body):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Optional[Usage] = None
    speculation: Optional[SpeculationStats] = None


class Delta(Body):
    role: Optional[Literal["assistant"]] = None
    content: Optional[str] = None
    tool_calls: Optional[list[ToolCall]] = None


class ChunkChoice(Body):
    index: int
    delta: Delta
    logprobs: Optional[ChatLogprobs]
    finish_reason: Optional[str]
    speculation: Optional[SpeculationStats] = None
    provenance: Optional[dict[str, Any]] = None


class ChatCompletionChunk(Body):
    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Optional[Usage] = None
    speculation: Optional[SpeculationStats] = None
