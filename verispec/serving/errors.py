"""The OpenAI-style error every bad request becomes: HTTP 400 (or the status
given) with the body `{"error": {"message", "type", "param", "code"}}`, and the
translation of pydantic's validation errors into it."""
from __future__ import annotations

import types
from typing import Annotated, Any, Literal, Sequence, Union, get_args, get_origin

from pydantic import BaseModel, Tag


class APIError(Exception):
    def __init__(self, message: str, param: str | None = None, code: str | None = "invalid_value",
                 status: int = 400, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message, self.param, self.code, self.status, self.kind = message, param, code, status, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code}}


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    """The error response, for the OpenAPI schema."""
    error: ErrorDetail


def _bare(kind: Any) -> Any:
    """`kind` without Annotated metadata or an Optional's None."""
    while True:
        if get_origin(kind) is Annotated:
            kind = get_args(kind)[0]
        elif _is_union(kind) and type(None) in get_args(kind):
            rest = [a for a in get_args(kind) if a is not type(None)]
            kind = rest[0] if len(rest) == 1 else Union[tuple(rest)]
        else:
            return kind


def _is_union(kind: Any) -> bool:
    return get_origin(kind) in (Union, types.UnionType)


def _branch(union: Any, tag: Any) -> Any:
    """The member of a union that pydantic's loc entry `tag` names: a callable
    discriminator's `Tag`, or the value of a model's literal `type` field."""
    for member in get_args(union):
        if get_origin(member) is Annotated and any(
                isinstance(m, Tag) and m.tag == tag for m in get_args(member)[1:]):
            return member
        bare = _bare(member)
        if isinstance(bare, type) and issubclass(bare, BaseModel) and "type" in bare.model_fields:
            field = bare.model_fields["type"].annotation
            if get_origin(field) is Literal and tag in get_args(field):
                return member
    return None


def param_path(model: type[BaseModel] | None, loc: Sequence) -> str | None:
    """OpenAI's name for the field at pydantic's `loc` (`messages[0].content`):
    union tags are dropped, and a dict's keys are data, so the dict is the param."""
    if model is None:  # no model to walk: every string is a field name
        out = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
        return out or None
    out, kind = "", model
    for part in loc:
        kind = _bare(kind)
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            names = {f.alias or name: name for name, f in kind.model_fields.items()}
            if part not in names:
                break
            out = f"{out}.{part}" if out else str(part)
            kind = kind.model_fields[names[part]].annotation
        elif get_origin(kind) is list and isinstance(part, int):
            out, kind = f"{out}[{part}]", get_args(kind)[0]
        elif _is_union(kind):
            kind = _branch(kind, part)
            if kind is None:
                break
        else:
            break
    return out or None


_TYPE_ERRORS = {"invalid_type", "int_from_float", "model_attributes_type", "model_type"}


def validation_error(errors: Sequence[dict], model: type[BaseModel] | None) -> APIError:
    """The first of pydantic's (or FastAPI's) validation errors as an APIError."""
    error = errors[0]
    loc = tuple(error.get("loc", ()))
    if loc and loc[0] in ("body", "query", "path"):
        loc = loc[1:]
    kind, value = error.get("type", ""), error.get("input")
    if kind == "json_invalid":
        detail = (error.get("ctx") or {}).get("error", "")
        return APIError("We could not parse the JSON body of your request: it is not valid "
                        f"JSON ({detail}).", None, "invalid_json")
    if not loc and kind != "value_error":
        if isinstance(value, (bytes, str)):
            return APIError("The request body must be a JSON object, sent with "
                            "'Content-Type: application/json'.", None, "invalid_json")
        return APIError("The request body must be a JSON object.", None, "invalid_json")
    param = param_path(model, loc)
    message = error.get("msg", "invalid")
    if message.startswith("Value error, "):
        message = message[len("Value error, "):]
    if kind == "extra_forbidden":  # the unknown name is no field of the model: appended
        head = param_path(model, loc[:-1])
        param = f"{head}.{loc[-1]}" if head else str(loc[-1])
        return APIError(f"Unrecognized request argument supplied: {param}", param,
                        "unknown_parameter")
    if kind == "missing":
        return APIError(f"Missing required parameter: '{param}'.", param,
                        "missing_required_parameter")
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        field = str((error.get("ctx") or {}).get("discriminator", "")).strip("'")
        param = f"{param}.{field}" if param and field else param
    if kind.endswith("_type") or kind in _TYPE_ERRORS:
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        return APIError(f"Invalid type for '{param}': {message}, got {type(value).__name__} "
                        f"{shown}", param, "invalid_type")
    return APIError(f"Invalid value for '{param}': {message}", param)
