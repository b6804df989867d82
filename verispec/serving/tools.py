"""OpenAI tool calls through grammar-constrained output.

`tool_choice` naming a function, or "required", makes the answer a call: the
arguments are generated under that function's `parameters` schema (for
"required", under a schema whose every branch is one function's name and
arguments), and the reply carries `tool_calls` with finish_reason
"tool_calls". "none" and "auto" keep the plain answer: the default model's
chat template has no tool syntax, so "auto" could only guess when to call.
The functions are described to the model in a system message, since a
template without tools would drop them.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from ..config import Grammar
from .errors import APIError
from .requests import ChatRequest


@dataclass(frozen=True)
class ToolPlan:
    grammar: Grammar
    named: str | None  # the forced function; None: "required", the model picks one
    note: str  # the system message that describes the functions


def plan_tools(request: ChatRequest) -> ToolPlan | None:
    """The tool plan of a chat request; None when the answer stays plain text."""
    choice = request.tool_choice
    if not request.tools:
        if choice not in (None, "none", "auto"):
            raise APIError("'tool_choice' needs 'tools'", "tool_choice")
        return None
    functions = {tool.function.name: tool.function for tool in request.tools}
    if choice in (None, "none", "auto"):
        return None
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


def tool_calls(plan: ToolPlan, text: str) -> list[dict]:
    """The `tool_calls` of a reply generated under the plan's grammar."""
    if plan.named is not None:
        name, arguments = plan.named, text
    else:
        call = json.loads(text)
        name, arguments = call["name"], json.dumps(call["arguments"], ensure_ascii=False)
    return [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": name, "arguments": arguments}}]
