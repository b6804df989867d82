"""OpenAI request bodies as pydantic models: FastAPI validates them before a
route runs, and `errors.validation_error` turns the first failure into
OpenAI's error JSON (HTTP 400, `param` naming the field as OpenAI writes it,
`messages[0].content`).

Strict types (JSON true is not the number 1, "3" is not 3), and unknown fields
are refused as OpenAI refuses them, so a misspelt option is an error rather
than silently ignored; message objects and content parts alone ignore fields
they do not use (clients echo `name`, `tool_calls`, `refusal` back). A null
is the field's default, in every object, as OpenAI takes it (clients other than
openai-python send explicit nulls). Fields OpenAI takes that verispec does not
use are typed here too; `conformance` says which are ignored and which refused
(docs/openai_conformance.md). Every
string refuses a lone UTF-16 surrogate: valid JSON ("\\ud800") but no text a
tokenizer can encode. Each union is tagged by a callable discriminator, so an
error names one branch and its message says what the field takes.

Checks that need the model or the server (the served names, the vocabulary,
the context, a schema's compilation) and those across fields are in
`protocol.build_job`.
"""
from __future__ import annotations

from typing import Annotated, Any, Callable, Literal, Optional, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StringConstraints,
    Tag,
    field_validator,
    model_validator,
)

MAX_N = 16
MAX_K = 32
MAX_TREE = 256  # tree nodes a request may have verified per step
MAX_TOKENS = 1 << 30


def _whole_text(value: str) -> str:
    if any("\ud800" <= c <= "\udfff" for c in value):
        raise ValueError("the string holds a lone UTF-16 surrogate, which is not valid Unicode text")
    return value


def _whole_json(value: Any) -> Any:
    """A JSON value whose every string (keys too) is whole text."""
    if isinstance(value, str):
        _whole_text(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            _whole_text(key)
            _whole_json(item)
    elif isinstance(value, list):
        for item in value:
            _whole_json(item)
    return value


Text = Annotated[str, AfterValidator(_whole_text)]
JsonObject = Annotated[dict[str, Any], AfterValidator(_whole_json)]
NonEmpty = Annotated[Text, StringConstraints(min_length=1)]
TokenId = Annotated[int, Field(ge=0)]


def tagged(branches: dict[str, Any], pick: Callable[[Any], str | None], expected: str) -> Any:
    """A union whose branch `pick(value)` names; a value no branch takes is an
    `invalid_type` error saying `expected`."""
    members = tuple(Annotated[kind, Tag(tag)] for tag, kind in branches.items())
    return Annotated[Union[members], Discriminator(pick, custom_error_type="invalid_type",
                                                   custom_error_message=f"expected {expected}")]


def _kind(value: Any) -> str | None:
    """JSON's kind of a value, as the tags of `tagged` unions spell it."""
    if isinstance(value, bool):
        return "boolean"
    for kind, name in ((int, "integer"), (str, "string"), (list, "array"), (dict, "object")):
        if isinstance(value, kind):
            return name
    return None


class Body(BaseModel):
    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        """A null field takes its default: OpenAI reads `"temperature": null` as unset."""
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if value is not None}
        return data


class Strict(Body):
    model_config = ConfigDict(extra="forbid", strict=True)


class Lenient(Body):
    """An object a client may send with more fields than verispec reads."""
    model_config = ConfigDict(extra="ignore", strict=True)


class Speculation(Strict):
    """verispec's extension: how this request is speculated (the server's defaults otherwise)."""
    proposer: Optional[Text] = None
    k: Optional[tagged({"integer": Annotated[int, Field(ge=0, le=MAX_K)],
                        "string": Literal["auto"]}, _kind,
                       f"an integer in [0, {MAX_K}] or 'auto'")] = None
    tree: Optional[Annotated[int, Field(ge=0, le=MAX_TREE)]] = None
    draft: Optional[Text] = None
    # proposer lookahead: W, N and G (docs/lookahead.md)
    lookahead_window: Optional[Annotated[int, Field(ge=1, le=64)]] = None
    lookahead_ngram: Optional[Annotated[int, Field(ge=2, le=16)]] = None
    lookahead_guesses: Optional[Annotated[int, Field(ge=0, le=64)]] = None
    # under a grammar, draft the tokens it forces (default true; false only to measure them)
    grammar_forced: Optional[StrictBool] = None


class StreamOptions(Strict):
    include_usage: bool = False
    include_obfuscation: bool = False  # ignored: padding against side channels on OpenAI's wire
    # vLLM's extension (guidellm sends it): every chunk carries the usage so far.
    continuous_usage_stats: bool = False
    include_provenance: bool = False  # verispec: where each streamed token came from


Stop = tagged({"string": NonEmpty,
               "array": Annotated[list[NonEmpty], Field(max_length=4)]}, _kind,
              "a non-empty string or an array of up to 4 non-empty strings")
# OpenAI's {"token id": bias}; the ids are checked against the vocabulary in build_job.
LogitBias = dict[Annotated[str, StringConstraints(pattern=r"^\s*\d+\s*$")],
                 Annotated[float, Field(ge=-100, le=100, allow_inf_nan=False)]]


class TextPart(Lenient):
    type: Literal["text"]
    text: Text


Content = tagged({"string": Text, "array": list[TextPart]}, _kind,
                 "a string or an array of text parts {'type': 'text', 'text': ...}")


def content_text(content: "str | list[TextPart]") -> str:
    return content if isinstance(content, str) else "".join(part.text for part in content)


class Prediction(Strict):
    """OpenAI's Predicted Outputs: text the answer is expected to repeat, which drafts
    first (verispec.proposers.prediction); the output does not change."""
    type: Literal["content"]
    content: Content


class Common(Strict):
    """The fields both routes take."""
    model: Text  # checked against the served names in build_job
    max_tokens: Optional[Annotated[int, Field(ge=1, le=MAX_TOKENS)]] = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0, allow_inf_nan=False)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)] = 1.0
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    stop: Optional[Stop] = None
    seed: Optional[Annotated[int, Field(ge=-(1 << 63), lt=1 << 63)]] = None  # OpenAI's int64
    user: Optional[Text] = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0, allow_inf_nan=False)] = 0.0
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0, allow_inf_nan=False)] = 0.0
    logit_bias: Optional[LogitBias] = None
    # vLLM's names
    repetition_penalty: Annotated[float, Field(gt=0.0, le=10.0, allow_inf_nan=False)] = 1.0
    min_p: Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)] = 0.0
    min_tokens: Annotated[int, Field(ge=0, le=MAX_TOKENS)] = 0
    # verispec's
    top_k: Annotated[int, Field(ge=-1, le=1 << 20)] = 0  # -1 and 0: off
    ignore_eos: bool = False
    speculation: Optional[Speculation] = None
    prediction: Optional[Prediction] = None  # OpenAI's, on completions too

    @property
    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())


def _prompt_kind(value: Any) -> str | None:
    if isinstance(value, str):
        return "string"
    if not isinstance(value, list):
        return None
    if value and all(_kind(v) == "integer" for v in value):
        return "token ids"
    if all(isinstance(v, str) for v in value):
        return "strings"
    if all(isinstance(v, list) for v in value):
        return "token id arrays"
    return None


Prompt = tagged({"string": Text, "token ids": list[TokenId], "strings": list[Text],
                 "token id arrays": list[list[TokenId]]}, _prompt_kind,
                "a string, an array of strings, an array of token ids or an array of such arrays")


class CompletionRequest(Common):
    prompt: Prompt
    logprobs: Optional[Annotated[int, Field(ge=0, le=20)]] = None
    echo: bool = False
    best_of: Optional[Annotated[int, Field(ge=1, le=MAX_N)]] = None
    suffix: Optional[Text] = None  # insertion: refused unless empty (conformance.REFUSED)

    @field_validator("prompt")
    @classmethod
    def _not_empty(cls, prompt):
        prompts = [prompt] if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)) \
            else prompt
        if not prompts or any(not p or (isinstance(p, str) and not p.strip()) for p in prompts):
            raise ValueError("the prompt is empty")
        return prompt

    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: a string or a list of token ids."""
        if isinstance(self.prompt, str) or isinstance(self.prompt[0], int):
            return [self.prompt]
        return list(self.prompt)


class Message(Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[Content] = Field(default=None, validate_default=True)
    # Passed to chat templates that write tools (verispec.serving.tools).
    tool_calls: Optional[list[JsonObject]] = None
    tool_call_id: Optional[Text] = None

    @field_validator("content")
    @classmethod
    def _needs_content(cls, content, info):
        if content is None and info.data.get("role") != "assistant":
            raise ValueError("only an assistant message may have no content")
        return content

    def text(self) -> str:
        return content_text(self.content or "")


class JsonSchemaSpec(Strict):
    name: Optional[Text] = None
    description: Optional[Text] = None
    schema_: JsonObject = Field(default_factory=dict, alias="schema")
    strict: Optional[bool] = None  # enforced either way: stricter than asked


class TextFormat(Strict):
    type: Literal["text"]


class JsonObjectFormat(Strict):
    type: Literal["json_object"]


class JsonSchemaFormat(Strict):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


class RegexFormat(Strict):
    """verispec: the output matches a regular expression."""
    type: Literal["regex"]
    regex: NonEmpty


class GrammarFormat(Strict):
    """verispec: the output follows a Lark grammar (llguidance's dialect)."""
    type: Literal["grammar"]
    grammar: NonEmpty


ResponseFormat = Annotated[Union[TextFormat, JsonObjectFormat, JsonSchemaFormat, RegexFormat,
                                 GrammarFormat], Field(discriminator="type")]


class Function(Lenient):
    name: NonEmpty
    description: Text = ""
    parameters: JsonObject = Field(
        default_factory=lambda: {"type": "object", "properties": {}})
    strict: Optional[bool] = None


class Tool(Lenient):
    type: Literal["function"]
    function: Function


class FunctionName(Lenient):
    name: Text


class NamedToolChoice(Lenient):
    type: Literal["function"]
    function: FunctionName


class AllowedTools(Lenient):
    mode: Literal["auto", "required"]
    tools: list[NamedToolChoice]  # {"type": "function", "function": {"name": ...}}


class AllowedToolChoice(Lenient):
    """OpenAI's allowed_tools: the call (mode) is made among these tools only."""
    type: Literal["allowed_tools"]
    allowed_tools: AllowedTools


def _choice_kind(value: Any) -> str | None:
    if isinstance(value, dict):
        return {"function": "function", "allowed_tools": "allowed_tools"}.get(value.get("type"))
    return _kind(value)


ToolChoice = tagged({"string": Literal["none", "auto", "required"], "function": NamedToolChoice,
                     "allowed_tools": AllowedToolChoice}, _choice_kind,
                    "'none', 'auto', 'required', {'type': 'function', 'function': {'name': ...}} "
                    "or {'type': 'allowed_tools', 'allowed_tools': {'mode', 'tools'}} (custom "
                    "tools are not supported)")


class ChatRequest(Common):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Optional[Annotated[int, Field(ge=1, le=MAX_TOKENS)]] = None
    logprobs: bool = False
    top_logprobs: Optional[Annotated[int, Field(ge=0, le=20)]] = None
    response_format: Optional[ResponseFormat] = None
    tools: Optional[list[Tool]] = None
    tool_choice: Optional[ToolChoice] = None
    parallel_tool_calls: Optional[bool] = None
    modalities: Optional[list[Literal["text", "audio"]]] = None  # only ["text"] is served
    # accepted and ignored (conformance.IGNORED says why)
    store: Optional[bool] = None
    metadata: Optional[dict[Text, Text]] = None
    service_tier: Optional[Text] = None
    safety_identifier: Optional[Text] = None
    prompt_cache_key: Optional[Text] = None
    prompt_cache_retention: Optional[Text] = None
    prompt_cache_options: Optional[JsonObject] = None
    reasoning_effort: Optional[Text] = None
    verbosity: Optional[Text] = None
    # refused when set (conformance.REFUSED says why)
    audio: Optional[JsonObject] = None
    web_search_options: Optional[JsonObject] = None
    moderation: Optional[JsonObject] = None
    functions: Optional[list[JsonObject]] = None
    function_call: Optional[Union[Text, JsonObject]] = None

    @field_validator("messages")
    @classmethod
    def _not_all_empty(cls, messages):
        if not any(m.text().strip() for m in messages):
            raise ValueError("the messages are all empty")
        return messages
