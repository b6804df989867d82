"""The `predicted-edit` workload: edit one function of an installed package, with the
function as it stands sent as the prediction (OpenAI's Predicted Outputs), as an
editor sends the file being edited. The answer repeats the code but for the edit,
so the prediction is the draft the answer is aligned with (docs/workloads.md).

Two edits in turn, so any prefix mixes them: rename a name used several times in
the function (every use changes, the rest is copied), or add a docstring to a
function that has none (new text inserted, then the whole body copied).
"""
from __future__ import annotations

import ast
import re

# (slug, kind, module, qualified name, arguments of the edit)
PREDICTED_EDITS = [
    ("version-init-rename", "rename", "packaging.version", "Version.__init__", ("match", "parsed")),
    ("setstate-docstring", "docstring", "packaging.specifiers", "SpecifierSet.__setstate__", ()),
    ("lexer-wrap-rename", "rename", "jinja2.lexer", "Lexer.wrap", ("token", "kind")),
    ("get-params-docstring", "docstring", "click.core", "Command.get_params", ()),
    ("prepare-body-rename", "rename", "requests.models", "PreparedRequest.prepare_body", ("body", "payload")),
    ("body-framing-docstring", "docstring", "h11._connection", "_body_framing", ()),
    ("compile-path-rename", "rename", "starlette.routing", "compile_path", ("path_regex", "pattern")),
    ("super-len-docstring", "docstring", "requests.utils", "super_len", ()),
    ("column-widths-rename", "rename", "rich.table", "Table._calculate_column_widths", ("widths", "column_widths")),
    ("process-event-docstring", "docstring", "h11._connection", "Connection._process_event", ()),
    ("check-label-rename", "rename", "idna.core", "check_label", ("cp_value", "code_point")),
    ("bind-socket-docstring", "docstring", "uvicorn.config", "Config.bind_socket", ()),
    ("do-insertions-rename", "rename", "pygments.lexer", "do_insertions", ("realpos", "real_position")),
    ("single-quoted-docstring", "docstring", "yaml.emitter", "Emitter.write_single_quoted", ()),
    ("generate-latest-rename", "rename", "prometheus_client.exposition", "generate_latest", ("mtype", "metric_type")),
    ("cached-call-docstring", "docstring", "fsspec.spec", "_Cached.__call__", ()),
    ("tqdm-update-rename", "rename", "tqdm.std", "tqdm.update", ("cur_t", "now")),
    ("cached-getattr-docstring", "docstring", "attr._make", "_make_cached_property_getattr", ()),
    ("validate-repo-id-rename", "rename", "huggingface_hub.utils._validators", "validate_repo_id", ("repo_id", "repository_id")),
    ("parse-decls-docstring", "docstring", "click.core", "Option._parse_decls", ()),
]

TASKS = {
    "rename": "Rename `{0}` to `{1}` everywhere in the code below: where it is defined and every "
              "use. Change nothing else; keep comments and formatting as they are.",
    "docstring": "Add a concise docstring to `{0}`, which has none. Do not change any of the "
                 "code itself.",
}
MIN_USES = 3  # a rename must touch several lines, so the answer is not one long copy


def _has_docstring(code: str) -> bool:
    node = ast.parse(code).body[0]
    return ast.get_docstring(node) is not None


def build_predicted(extract, origin, built) -> list:
    """The workload's prompts: `extract(module, qualname)` reads the code,
    `origin(module)` names its package and version, `built` makes a line."""
    out = []
    for slug, kind, module_name, qualname, args in PREDICTED_EDITS:
        code = extract(module_name, qualname)
        version, where = origin(module_name)
        name = qualname.rsplit(".", 1)[-1]
        if kind == "rename":
            uses = len(re.findall(rf"\b{re.escape(args[0])}\b", code))
            if uses < MIN_USES:
                raise SystemExit(f"predicted-edit-{slug}: {args[0]!r} occurs {uses} times")
            task = TASKS[kind].format(*args)
        else:
            if _has_docstring(code):
                raise SystemExit(f"predicted-edit-{slug}: {qualname} has a docstring already")
            task = TASKS[kind].format(name)
        content = (f"The following code is `{qualname}` from {where}.\n\n{task} Output the full "
                   f"edited code in a single ```python code block.\n\n```python\n{code}\n```")
        source = f"{version}: {module_name}.{qualname}, edit={kind}; prediction: the code as given"
        out.append(built(f"predicted-edit-{slug}", "predicted-edit", content, source,
                         prediction=code))
    return out
