"""The house shows the pipeline (issue 22): packages by stage, no import circles,
modules of one job. The layers themselves are import-linter's contracts in
pyproject.toml, run by scripts/check; here, what those contracts cannot say."""

from __future__ import annotations

import ast
from pathlib import Path

import grimp
import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "numad"
STAGES = ("topology", "placement", "workload", "host", "daemon", "cli")
MAX_LINES = 420  # "around 400": the merge (417) is one algorithm, kept whole


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_only_the_shared_vocabulary_sits_directly_in_numad() -> None:
    direct = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(direct) <= 8, direct
    packages = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
    assert packages == sorted(STAGES)


def test_no_import_circles() -> None:
    graph = grimp.build_graph("numad")
    circles = []
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back is not None:
                circles.append((module, *back))
    assert circles == []


def test_a_circle_would_be_found() -> None:
    """The check above is not vacuous: an import back up a chain is a circle."""
    graph = grimp.build_graph("numad")
    graph.add_import(importer="numad.cpuset", imported="numad.placement.admission")
    assert graph.find_shortest_chain(importer="numad.placement.admission", imported="numad.cpuset")


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_of_one_job(path: Path) -> None:
    assert path.stem not in ("utils", "helpers", "common", "misc")
    assert len(path.read_text(encoding="utf-8").splitlines()) <= MAX_LINES
    assert ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or path.stat().st_size < 2


@pytest.mark.parametrize("stage", STAGES)
def test_each_stage_says_what_it_may_import(stage: str) -> None:
    doc = ast.get_docstring(ast.parse((PACKAGE / stage / "__init__.py").read_text()))
    assert doc is not None
    assert "import" in doc, doc
    assert 2 <= len(doc.splitlines()) <= 5, doc
