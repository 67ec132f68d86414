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


# The package DAG: a package imports only packages before it, so each one can be read, tested and
# changed knowing only what comes before (the pipeline's own order: data, checks on the data, the
# models, training them, using them, then what records, exports, reports and serves them).
PACKAGE_ORDER = (
    "core",
    "data",
    "checks",
    "models",
    "pretrain",
    "finetune",
    "evaluate",
    "lineage",
    "interop",
    "reports",
    "apps",
)
MAX_PIPELINE_FILE_LINES = 700
MAX_STAGE_FUNCTION_LINES = 80


def _package_edges(graph: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """``{(package, imported package): ["module -> module", ...]}`` between pipeline's subpackages."""
    edges: dict[tuple[str, str], list[str]] = {}
    for module, targets in graph.items():
        for target in targets:
            a, b = module.split("."), target.split(".")
            if a[0] == b[0] == "pipeline" and len(a) > 2 and len(b) > 2 and a[1] != b[1]:
                edges.setdefault((a[1], b[1]), []).append(f"{module} -> {target}")
    return edges


def _upward(edges: dict[tuple[str, str], list[str]], order: tuple[str, ...]) -> list[str]:
    return sorted(m for (a, b), ms in edges.items() if order.index(b) > order.index(a) for m in ms)


def test_every_pipeline_package_has_its_place_in_the_order():
    packages = {p.name for p in (REPO / "pipeline").iterdir() if (p / "__init__.py").exists()}
    assert packages == set(PACKAGE_ORDER)


def test_packages_import_only_packages_before_them():
    """No upward edge, hence no package cycle (core -> data -> checks -> models -> pretrain ->
    finetune -> evaluate -> lineage -> interop -> reports -> apps)."""
    edges = _package_edges(_graph())
    assert edges, "no edge between packages found: the test would pass vacuously"
    assert _upward(edges, PACKAGE_ORDER) == []
    package_graph = {p: {b for (a, b) in edges if a == p} for p in PACKAGE_ORDER}
    assert _cycles(package_graph) == []


def test_the_upward_edge_finder_finds_one():
    edges = _package_edges({"pipeline.core.io": {"pipeline.data.clean"}, "pipeline.data.clean": {"pipeline.core.io"}})
    assert _upward(edges, PACKAGE_ORDER) == ["pipeline.core.io -> pipeline.data.clean"]
    assert _cycles({"core": {"data"}, "data": {"core"}}) == [["core", "data"]]


def test_no_pipeline_file_is_longer_than_the_limit():
    long = {
        p.relative_to(REPO).as_posix(): n
        for p in sorted((REPO / "pipeline").rglob("*.py"))
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_PIPELINE_FILE_LINES
    }
    assert long == {}, f"split these files (limit {MAX_PIPELINE_FILE_LINES} lines): {long}"


def test_stage_functions_stay_short():
    """A stage parses params, calls pipeline/ and writes outputs; logic longer than this belongs in pipeline/."""
    long = []
    for path in sorted((REPO / "stages").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_STAGE_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO).as_posix()}:{node.name} ({n} lines)")
    assert long == [], long


def _top_level_names(path: Path) -> tuple[set[str], set[str]]:
    """(names ``path`` defines at module level, names it imports from our packages)."""
    defined, imported = set(), set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PACKAGES:
            imported |= {a.asname or a.name for a in node.names}
    return defined, imported - defined


def test_names_are_imported_from_the_module_that_defines_them():
    """No re-export: ``from pipeline.a import x`` only where ``pipeline/a.py`` defines ``x``, so
    moving ``x`` breaks its importers loudly instead of leaving a second path to it."""
    modules = _modules()
    names = {name: _top_level_names(path) for name, path in modules.items()}
    offenders = []
    for path in sorted(
        p for d in ("pipeline", "stages", "tests", "bench", "scripts") for p in (REPO / d).rglob("*.py")
    ):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module in modules:
                defined, reexported = names[node.module]
                offenders += [
                    f"{path.relative_to(REPO).as_posix()}:{node.lineno} {node.module}.{a.name}"
                    for a in node.names
                    if a.name in reexported and f"{node.module}.{a.name}" not in modules
                ]
    assert offenders == [], f"import these from the module that defines them: {offenders}"
