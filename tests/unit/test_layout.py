"""The code's layout keeps its promises: no import cycle in ``pipeline/`` (function-level imports
count), no module importing another's ``_private`` name, and stages that do not import code they
do not run, so an edit reruns only the stages it can change (dvc.yaml's code deps are these
closures: tests/unit/test_dvc_deps.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.import_graph import REPO, closure, module_imports, stage_modules

PACKAGES = ("pipeline", "stages")


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def _graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (a ``from pkg import name`` of a function counts as pkg)."""
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        targets = {i if i in modules else i.rsplit(".", 1)[0] for i in module_imports(path)}
        graph[name] = {t for t in targets if t in modules and t != name and not name.startswith(t + ".")}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
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
        for w in sorted(graph[v]):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles_counting_function_level_imports():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_package_init_is_a_docstring_only():
    """A stage's import closure counts every parent ``__init__.py``: code there would make each
    module's importers depend on its siblings."""
    inits = sorted((REPO / "pipeline").rglob("__init__.py"))
    assert len(inits) >= 12
    for path in inits:
        body = ast.parse(path.read_text(encoding="utf-8")).body
        assert len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant), path


def test_no_module_imports_another_modules_private_names():
    private = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.split(".")[0] in PACKAGES
                and node.module != name
            ):
                private += [f"{name} imports {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    assert private == []


def _stage_closure(stage: str) -> set[str]:
    return closure(stage_modules()[stage])


@pytest.mark.parametrize(
    "stage, never",
    [
        (
            "clean",
            {"pipeline/data/download.py", "pipeline/data/hub.py"},
        ),  # cleaning reads data/raw; it downloads nothing
        *[
            (stage, {"pipeline/data/tokenizer_training.py"})
            for stage in ("examples", "validate", "pretrain", "finetune")
        ],
        (
            "finetune",
            {
                "pipeline/pretrain/objectives/registry.py",
                "pipeline/pretrain/objectives/base.py",
                "pipeline/pretrain/objectives/bert.py",
                "pipeline/pretrain/objectives/clm.py",
                "pipeline/pretrain/objectives/electra.py",
                "pipeline/pretrain/loop.py",
                "pipeline/pretrain/trainer.py",
                "pipeline/pretrain/config.py",
            },
        ),
    ],
)
def test_a_stage_imports_none_of_the_code_it_does_not_run(stage, never):
    assert all((REPO / path).is_file() for path in never), never  # the files exist: the test can fail
    assert _stage_closure(stage) & never == set()


def test_tests_share_helpers_through_support_only():
    """Test modules import helpers from tests/support/ (or conftest), never from another test module,
    and every test module sits in tests/unit/<subpackage>/, tests/unit/ or tests/e2e/."""
    subpackages = {p.name for p in (REPO / "pipeline").iterdir() if (p / "__init__.py").exists()}
    offenders, misplaced = [], []
    for path in sorted((REPO / "tests").rglob("*.py")):
        rel = path.relative_to(REPO / "tests")
        if path.name.startswith("test_"):
            where = rel.parts[:-1]
            if not (
                where in (("unit",), ("e2e",)) or (len(where) == 2 and where[0] == "unit" and where[1] in subpackages)
            ):
                misplaced.append(rel.as_posix())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                last = name.split(".")[-1]
                if last.startswith("test_") or (
                    name.startswith("tests.") and name.split(".")[1] not in ("support", "conftest")
                ):
                    offenders.append(f"{rel.as_posix()}: {name}")
    assert not offenders, f"import helpers from tests/support/ instead: {offenders}"
    assert not misplaced, f"test modules outside tests/unit/<subpackage>/ and tests/e2e/: {misplaced}"
