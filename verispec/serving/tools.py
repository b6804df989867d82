"""OpenAI tool calls through grammar-constrained output.

`tool_choice` naming a function, or "required", makes the answer a call: the
arguments are generated under that function's `parameters` schema (for
"required", under a schema whose every branch is one function's name and
arguments), and the reply carries `tool_calls` with finish_reason
"tool_calls". The functions are described to the model in a system message,
since a template without tools would drop them. `allowed_tools` narrows the
tools to a list and takes its mode ("auto" or "required") as the choice.

"auto" (OpenAI's default when tools are sent) lets the model decide, which it
can only do if its chat template writes the tools into the prompt: then the
tools go to the template, the output is generated freely, and calls in the
formats templates teach (`<tool_call>{...}</tool_call>` blocks, as Hermes,
Qwen and SmolLM3 write them, or a reply that is a JSON call or list of calls,
as Llama 3 and Mistral write them) become `tool_calls`. A template that
ignores `tools` (the default model's) keeps the plain answer, as does "none".
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from verispec.config import Grammar
from verispec.serving.errors import APIError
from verispec.serving.requests import AllowedToolChoice, ChatRequest


@dataclass(frozen=True)
class ToolPlan:
    grammar: Grammar | None  # the arguments' grammar; None: "auto", the output is free
    named: str | None  # the forced function; None: "required" or "auto", the model picks
    note: str | None  # the system message that describes the functions ("auto": the template's)
    template_tools: list[dict] | None = None  # "auto": the tools, as the chat template takes them
    parallel: bool = True  # parallel_tool_calls: an "auto" reply may hold several calls

    @property
    def names(self) -> frozenset[str]:
        return frozenset(t["function"]["name"] for t in self.template_tools or ())


_PROBE = "verispec_probe_function"
_RENDERS: dict[str, bool] = {}


def renders_tools(tokenizer) -> bool:
    """Whether the tokenizer's chat template writes a `tools` list into the prompt."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return False
    key = template if isinstance(template, str) else json.dumps(template, sort_keys=True)
    if key not in _RENDERS:
        probe = {"type": "function", "function": {"name": _PROBE, "description": "",
                                                  "parameters": {"type": "object", "properties": {}}}}
        try:
            text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tools=[probe],
                                                 add_generation_prompt=True, tokenize=False)
            _RENDERS[key] = _PROBE in str(text)
        except Exception:  # a template (or tokenizer) that takes no tools
            _RENDERS[key] = False
    return _RENDERS[key]


def plan_tools(request: ChatRequest, tokenizer=None) -> ToolPlan | None:
    """The tool plan of a chat request; None when the answer stays plain text."""
    choice = request.tool_choice
    if not request.tools:
        if choice not in (None, "none", "auto"):
            raise APIError("'tool_choice' needs 'tools'", "tool_choice")
        return None
    functions = {tool.function.name: tool.function for tool in request.tools}
    if isinstance(choice, AllowedToolChoice):  # the call is made among these tools only
        allowed = [tool.function.name for tool in choice.allowed_tools.tools]
        unknown = [name for name in allowed if name not in functions]
        if unknown or not allowed:
            raise APIError(f"tool_choice.allowed_tools names {unknown[0]!r}, which is not among "
                           "the tools" if unknown else "tool_choice.allowed_tools lists no tool",
                           "tool_choice.allowed_tools.tools")
        functions = {name: functions[name] for name in allowed}
        choice = choice.allowed_tools.mode
    if choice == "none":
        return None
    if choice in (None, "auto"):
        if not renders_tools(tokenizer):
            return None
        listed = [{"type": "function", "function": f.model_dump(exclude_none=True)}
                  for f in functions.values()]
        return ToolPlan(None, None, None, listed, request.parallel_tool_calls is not False)
    if choice == "required":
        branches = [{"type": "object", "properties": {"name": {"const": name},
                                                      "arguments": f.parameters},
                     "required": ["name", "arguments"], "additionalProperties": False}
                    for name, f in functions.items()]
        schema = branches[0] if len(branches) == 1 else {"anyOf": branches}
        listing = "\n".join(f"- {n}: {f.description}" for n, f in functions.items())
        note = ("Answer with a JSON object {\"name\": <function>, \"arguments\": {...}} calling "
                f"one of these functions:\n{listing}")
        return ToolPlan(Grammar("json_schema", json.dumps(schema)), None, note)
    name = choice.function.name
    if name not in functions:
        raise APIError(f"tool_choice names {name!r}, which is not among the tools",
                       "tool_choice.function.name")
    f = functions[name]
    note = (f"Call the function {name} ({f.description}): answer with its arguments as a "
            f"JSON object matching {json.dumps(f.parameters)}")
    return ToolPlan(Grammar("json_schema", json.dumps(f.parameters)), name, note)


def _call(name: str, arguments: str) -> dict:
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": arguments}}


def tool_calls(plan: ToolPlan, text: str) -> tuple[str | None, list[dict]] | None:
    """(content, `tool_calls`) of a finished reply; None when it holds no call: a
    forced call cut by a stop string (its JSON incomplete), or an "auto" reply
    without one (then the text is the answer)."""
    if plan.grammar is None:
        found = _template_calls(text, plan.names)
        return found if found is None or plan.parallel else (found[0], found[1][:1])
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if plan.named is not None:
        return None, [_call(plan.named, text)]
    return None, [_call(value["name"], json.dumps(value["arguments"], ensure_ascii=False))]


BLOCK_OPEN = "<tool_call>"
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def _template_calls(text: str, names: frozenset[str]) -> tuple[str | None, list[dict]] | None:
    """Calls as chat templates teach them: `<tool_call>` blocks anywhere (the text
    around them is the content), or a reply that is one JSON call or a list of them.
    Each call names one of the tools and carries an object of arguments
    ("arguments", or Llama 3's "parameters"); anything else is plain text."""
    blocks = _BLOCK.findall(text)
    payloads, content = (blocks, without_calls(text)) if blocks else ([text.strip()], "")
    calls = []
    for payload in payloads:
        try:
            value = json.loads(payload)
        except ValueError:
            return None
        for item in value if isinstance(value, list) else [value]:
            if not isinstance(item, dict) or item.get("name") not in names:
                return None
            arguments = item.get("arguments", item.get("parameters", {}))
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except ValueError:
                    return None
            if not isinstance(arguments, dict):
                return None
            calls.append(_call(item["name"], json.dumps(arguments, ensure_ascii=False)))
    return (content or None, calls) if calls else None


def without_calls(text: str) -> str:
    """An "auto" reply's text around its `<tool_call>` blocks (a JSON reply: none)."""
    rest = _BLOCK.sub("", text).strip()
    return "" if rest[:1] in ("{", "[") else rest


def held_from(text: str) -> int:
    """Where an "auto" reply's streamed text must stop until the reply is complete:
    at a call's first character (a `<tool_call>` block, or a reply opening with
    JSON), or at a partial `<tool_call>` at its end; len(text) if nothing is held."""
    stripped = text.lstrip()
    if stripped[:1] in ("{", "["):
        return 0
    at = text.find(BLOCK_OPEN)
    if at >= 0:
        return at
    for size in range(min(len(BLOCK_OPEN) - 1, len(text)), 0, -1):
        if text.endswith(BLOCK_OPEN[:size]):
            return len(text) - size
    return len(text)
