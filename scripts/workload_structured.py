"""The `structured` workload: fill a JSON schema from a document (build_workloads.py).

Each prompt is an installed package's core metadata (its METADATA file: the
header fields, then the start of its long description) or a stdlib module's
documentation, and one of four JSON schemas to fill from it. The schema goes
in the prompt (so the model knows what to write) and in the record's
`response_format` (OpenAI's `json_schema` shape, `strict`), which the bench
applies as the grammar of every run. Strings and arrays are bounded
(maxLength, maxItems) so that a complete answer fits in a few hundred tokens:
an answer cut by max_new_tokens cannot validate, and the bench counts those
apart from invalid ones.
"""
from __future__ import annotations

import importlib.metadata as md
import json

_TEXT = {"type": "string", "maxLength": 80}
_LONG = {"type": "string", "maxLength": 200}
_NULLABLE = {"type": ["string", "null"], "maxLength": 80}
_NAME = {"type": "string", "maxLength": 40}

SCHEMAS: dict[str, dict] = {
    "package-card": {
        "type": "object",
        "properties": {
            "name": _TEXT, "version": {"type": "string", "maxLength": 32}, "summary": _LONG,
            "license": _NULLABLE, "requires_python": _NULLABLE,
            "requirements": {"type": "array", "items": _NAME, "maxItems": 6},
        },
        "required": ["name", "version", "summary", "license", "requires_python", "requirements"],
        "additionalProperties": False,
    },
    "dependencies": {
        "type": "object",
        "properties": {
            "package": _TEXT,
            "dependencies": {"type": "array", "maxItems": 5, "items": {
                "type": "object",
                "properties": {"name": _NAME, "version_spec": {"type": "string", "maxLength": 24},
                               "optional": {"type": "boolean"}},
                "required": ["name", "version_spec", "optional"],
                "additionalProperties": False}},
        },
        "required": ["package", "dependencies"],
        "additionalProperties": False,
    },
    "classifiers": {
        "type": "object",
        "properties": {
            "name": _TEXT,
            "development_status": {"enum": ["Planning", "Pre-Alpha", "Alpha", "Beta",
                                            "Production/Stable", "Mature", "Inactive", "unknown"]},
            "python_versions": {"type": "array", "items": {"type": "string", "maxLength": 8},
                                "maxItems": 6},
            "topics": {"type": "array", "items": _NAME, "maxItems": 4},
            "homepage": _NULLABLE,
        },
        "required": ["name", "development_status", "python_versions", "topics", "homepage"],
        "additionalProperties": False,
    },
    "module-api": {
        "type": "object",
        "properties": {
            "module": _TEXT, "purpose": _LONG,
            "functions": {"type": "array", "maxItems": 4, "items": {
                "type": "object",
                "properties": {"name": _NAME, "does": {"type": "string", "maxLength": 120}},
                "required": ["name", "does"], "additionalProperties": False}},
        },
        "required": ["module", "purpose", "functions"],
        "additionalProperties": False,
    },
}

# (material kind, distribution or module, schema), interleaved so any prefix mixes schemas.
STRUCTURED = [
    ("metadata", "requests", "package-card"),
    ("metadata", "pytest", "dependencies"),
    ("metadata", "uvicorn", "classifiers"),
    ("stdlib", "secrets", "module-api"),
    ("metadata", "jsonschema", "package-card"),
    ("metadata", "httpx", "dependencies"),
    ("metadata", "numpy", "classifiers"),
    ("stdlib", "fnmatch", "module-api"),
    ("metadata", "tokenizers", "package-card"),
    ("metadata", "openai", "dependencies"),
    ("metadata", "packaging", "classifiers"),
    ("stdlib", "pprint", "module-api"),
    ("metadata", "rich", "package-card"),
    ("metadata", "prometheus-client", "dependencies"),
    ("metadata", "gguf", "classifiers"),
    ("stdlib", "glob", "module-api"),
    ("metadata", "llguidance", "package-card"),
    ("metadata", "safetensors", "dependencies"),
    ("metadata", "jinja2", "classifiers"),
    ("stdlib", "tempfile", "module-api"),
]
DOC_BUDGET = 600  # tokens of document per prompt (header lines first, whole paragraphs after)

INSTRUCTION = ("Fill in the JSON schema below with facts taken from the document that follows. "
               "Reply with one JSON object that matches the schema, and nothing else. Use null "
               "where the schema allows it and the document does not say.")


def metadata_document(dist: str) -> list[str]:
    """The METADATA file as shipped: header lines one by one (Description-less), then the
    long description's paragraphs."""
    text = md.distribution(dist).read_text("METADATA")
    if text is None:
        raise SystemExit(f"structured: {dist} has no METADATA")
    head, _, body = text.partition("\n\n")
    return head.splitlines() + [p for p in body.split("\n\n") if p.strip()]


def fit_lines(count, units: list[str], budget: int) -> str:
    """The longest prefix of `units` within budget tokens; header lines join with one
    newline, paragraphs after the first blank line with two."""
    kept: list[str] = []
    for unit in units:
        if count("\n".join(kept + [unit])) > budget:
            break
        kept.append(unit)
    return "\n".join(kept).rstrip()


def build_structured(tok, count, stdlib_doc, py: str, built):
    out = []
    for kind, ref, schema_name in STRUCTURED:
        schema = SCHEMAS[schema_name]
        if kind == "metadata":
            units = metadata_document(ref)
            source = f"{ref} {md.version(ref)}: METADATA (core metadata and long description)"
        else:
            units = stdlib_doc(ref)
            source = f"{py} stdlib: docstrings of module {ref} (inspect.getdoc)"
        doc = fit_lines(lambda t: count(tok, t), units, DOC_BUDGET)
        n = count(tok, doc)
        if not 150 <= n <= DOC_BUDGET:
            raise SystemExit(f"structured-{ref}: document is {n} tokens, outside 150-{DOC_BUDGET}")
        content = (f"{INSTRUCTION}\n\nSchema:\n```json\n{json.dumps(schema)}\n```\n\n"
                   f"<document>\n{doc}\n</document>")
        response_format = {"type": "json_schema", "json_schema": {
            "name": schema_name.replace("-", "_"), "schema": schema, "strict": True}}
        slug = f"structured-{schema_name}-{ref}".lower().replace("_", "-")
        out.append(built(slug, "structured", content, f"{source}; {n} tokens; schema {schema_name}",
                         response_format))
    return out
