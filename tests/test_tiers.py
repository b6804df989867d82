"""The two test tiers: `slow` comes from the fixtures a test uses (conftest.SLOW_FIXTURES),
never from a hand-written mark, so a test that loads the real model cannot slip into the
fast tier (`pytest -m "not slow"`) by someone forgetting a decorator."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import conftest

TESTS = Path(__file__).resolve().parent


def _fixtures_defined() -> set[str]:
    names = set()
    for path in TESTS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and any(
                    "fixture" in ast.unparse(d) for d in node.decorator_list):
                names.add(node.name)
    return names


def test_no_test_is_marked_slow_by_hand():
    marked = [f"{path.name}:{node.lineno}" for path in sorted(TESTS.rglob("test_*.py"))
              for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
              if isinstance(node, ast.Attribute) and node.attr == "slow"
              and isinstance(node.value, ast.Attribute) and node.value.attr == "mark"]
    assert marked == [], "a test is slow through a fixture in conftest.SLOW_FIXTURES"


def test_every_slow_fixture_exists():
    assert set(conftest.SLOW_FIXTURES) <= _fixtures_defined()


# One pytest run collects the file under `-m "not slow"` and reports both sides: the
# selected items as --collect-only prints them, the deselected ones from the
# pytest_deselected hook. A second collection of the whole file took as long again.
_COLLECT_BOTH_TIERS = """
import sys, pytest
class Deselected:
    def pytest_deselected(self, items):
        for item in items:
            print("DESELECTED " + item.nodeid)
sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "-m", "not slow", sys.argv[1]],
                     plugins=[Deselected()]))
"""


def _tiers(path: str) -> tuple[list[str], list[str]]:
    """(fast, slow): the node ids `-m "not slow"` keeps and the ones it leaves out."""
    run = subprocess.run([sys.executable, "-c", _COLLECT_BOTH_TIERS, path],
                         cwd=TESTS.parent, capture_output=True, text=True, timeout=300)
    assert run.returncode in (0, 5), run.stdout[-2000:] + run.stderr[-2000:]
    lines = [line for line in run.stdout.splitlines() if "::" in line]
    slow = [line.removeprefix("DESELECTED ") for line in lines if line.startswith("DESELECTED ")]
    fast = [line for line in lines if not line.startswith("DESELECTED ")]
    return fast, slow


def test_the_fast_tier_leaves_out_what_uses_a_slow_fixture():
    """test_lookahead.py mixes both tiers: its default-model and full-size distribution
    tests (through default_engine and full_size_runs) go; its tiny-model tests stay."""
    fast, slow = _tiers("tests/proposers/test_lookahead.py")
    assert not set(fast) & set(slow)
    assert any("test_greedy_equality_default_model" in t for t in slow)
    assert any("test_sampled_output_follows_the_target" in t for t in slow)
    assert fast and not any("default_model" in t for t in fast)
