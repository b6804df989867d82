"""The pages a user reads (README.md and docs/*.md; the notebook keeps its history as it was)
point only at files that exist: every relative markdown link, every repository path they name
in the text (`docs/results/...`, `verispec/...`, `tests/x.py::test_y`) and every module they
name (`verispec.policy.economics`), since a moved module or report otherwise leaves a dead
pointer that no other test sees."""
from __future__ import annotations

import glob
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
USER_PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
# A path is named from the repository root, starting at one of its top-level folders.
NAMED_PATH = re.compile(
    r"(?<![\w./-])((?:docs|verispec|scripts|tests|examples|\.ci)/[\w./*-]*[\w/*])")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:")
MODULE = re.compile(r"(?<![\w./-])verispec(?:\.\w+)+")


def _exists(path: Path) -> bool:
    return bool(glob.glob(str(path))) if "*" in str(path) else path.exists()


def _module_exists(dotted: str) -> bool:
    """`verispec.a.b.name`: each part is a subpackage until one is a module; what follows a
    module is an attribute, which only an import would check."""
    folder = REPO / "verispec"
    for part in dotted.split(".")[1:]:
        if (folder / f"{part}.py").exists():
            return True
        if not (folder / part).is_dir():
            return False
        folder = folder / part
    return True


def broken_references(page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    broken = []
    for match in LINK.finditer(text):
        target = match.group(1)
        if EXTERNAL.match(target) or target.startswith("#"):
            continue
        if not _exists(page.parent / target.split("#")[0]):
            broken.append(f"link ({target})")
    for match in NAMED_PATH.finditer(text):
        named = match.group(1).rstrip(".")
        if not _exists(REPO / named):
            broken.append(f"path {named}")
    for match in MODULE.finditer(text):
        if not _module_exists(match.group(0)):
            broken.append(f"module {match.group(0)}")
    return broken


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda page: page.relative_to(REPO).as_posix())
def test_a_user_page_points_only_at_files_that_exist(page: Path):
    broken = broken_references(page)
    assert broken == [], f"{page.relative_to(REPO)} points at files that do not exist: {broken}"


def test_a_dead_pointer_is_caught(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text("See [the guide](guide.md), ![a plot](img/none.png), `docs/nowhere.md`,\n"
                    "`verispec/step/sequence.py`, `tests/test_layers.py::test_x`, "
                    "`docs/results/quant_i8/fixedk_r*_report.md`, [a site](https://x.org),\n"
                    "`verispec.policy.economics.StepCost`, `verispec.engine` and `verispec.cli`.\n",
                    encoding="utf-8")
    (tmp_path / "guide.md").write_text("# guide\n", encoding="utf-8")
    assert broken_references(page) == ["link (img/none.png)", "path docs/nowhere.md",
                                       "module verispec.engine"]
