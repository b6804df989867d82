"""Imports run one way: config, economics, sampling, kv_cache <- models, proposers
<- engine, policy <- api <- cli, serving, bench, training. Read from the source
with `ast`, every import counts: module level, inside functions (where a cycle
hides) and under TYPE_CHECKING."""
from __future__ import annotations

import ast
from pathlib import Path

import verispec

ROOT = Path(verispec.__file__).parent
# Named layers, lowest first; a module may import its own layer or lower ones only.
LAYERS = [
    ("config", "economics", "cadence", "sampling", "kv_cache"),
    ("models", "proposers"),
    ("engine", "policy", "plan", "drafting", "request"),
    ("api",),
    ("cli", "cli_args", "serving", "bench", "training"),
]
TOP = LAYERS[-1]


def module_names() -> dict[str, Path]:
    names = {}
    for path in ROOT.rglob("*.py"):
        parts = ["verispec", *path.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def import_graph() -> dict[str, set[str]]:
    """Module -> the verispec modules it imports; `from pkg import name` points at
    pkg.name when that is a module, else at pkg."""
    modules = module_names()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[:len(package) - node.level + 1]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                for alias in node.names:
                    child = f"{prefix}.{alias.name}"
                    found.add(child if child in modules else prefix)
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else None
    for rank, names in enumerate(LAYERS):
        if top in names:
            return rank
    return None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_imports_inside_functions():
    graph = import_graph()
    assert "verispec.bench.runner" in graph["verispec.bench.bench_cli"]  # module level
    assert "verispec.serving.bench_serving" in graph["verispec.bench.bench_cli"]  # in a function
    assert "verispec.proposers" in graph["verispec.spec_text"]  # `from . import proposers`
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_nothing_below_api_imports_the_edges():
    below = {m for m in import_graph() if m != "verispec" and layer_of(m) != len(LAYERS) - 1
             and m != "verispec.api"}
    wrong = sorted(f"{m} -> {dep}" for m in below for dep in import_graph()[m]
                   if layer_of(dep) == len(LAYERS) - 1)
    assert wrong == []


def test_layers_import_downwards():
    graph = import_graph()
    wrong = sorted(f"{m} -> {dep}" for m, deps in graph.items() for dep in deps
                   if layer_of(m) is not None and layer_of(dep) is not None
                   and layer_of(dep) > layer_of(m))
    assert wrong == []


POLICY = {"verispec.plan", "verispec.policy", "verispec.acceptance", "verispec.cadence",
          "verispec.draft_shape", "verispec.economics", "verispec.config"}


def test_the_policy_imports_neither_torch_nor_the_mechanism():
    """How much to draft is decided on numbers alone: the policy modules import each
    other (and numpy), never torch, a model, a proposer or the step's mechanism; the
    request (verispec.request) is where the two meet."""
    graph = import_graph()
    assert POLICY <= set(graph)
    wrong = sorted(f"{m} -> {dep}" for m in POLICY for dep in graph[m] if dep not in POLICY)
    assert wrong == []
    for name in POLICY:
        tree = ast.parse(module_names()[name].read_text(encoding="utf-8"))
        imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                    if isinstance(node, ast.Import) for alias in node.names}
        imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom) and not node.level}
        assert "torch" not in imported, name


MECHANISM = {"verispec.engine", "verispec.rejection", "verispec.tree", "verispec.token_tree",
             "verispec.sampling", "verispec.stopping", "verispec.kv_cache", "verispec.lossless"}


def test_the_mechanism_has_no_clock_and_no_policy():
    """Feed, verify, roll back and stop (verispec.engine and what it calls) time nothing
    and decide nothing: the request times the step and its policy decides."""
    graph = import_graph()
    wrong = sorted(f"{m} -> {dep}" for m in MECHANISM for dep in graph[m]
                   if dep in POLICY - {"verispec.config"} or dep == "verispec.request")
    assert wrong == []
    for name in MECHANISM:
        tree = ast.parse(module_names()[name].read_text(encoding="utf-8"))
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}
        assert "time" not in imported, name
