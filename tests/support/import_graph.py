"""The import graph of pipeline/ and stages/ (ast, function-level imports included): a stage's code closure."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]

PACKAGES = ("pipeline", "stages")


def _module_file(name: str) -> Path | None:
    """The file of module ``name`` (``pipeline.x`` -> pipeline/x.py or pipeline/x/__init__.py)."""
    base = REPO.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def module_imports(path: Path) -> set[str]:
    """Modules of our packages that ``path`` imports (``from pipeline import x`` -> pipeline.x)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] in PACKAGES and _module_file(name) is not None:
                out.add(name)
    return out


def closure(entry_module: str, neutral: tuple[str, ...] = ()) -> set[str]:
    """Repo-relative files of ``entry_module`` and everything of ours it imports, transitively;
    the modules in ``neutral`` are neither counted nor followed."""
    seen: set[str] = set()
    todo = [entry_module]
    while todo:
        name = todo.pop()
        if name in seen or name in neutral:
            continue
        seen.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # parent packages' __init__
        path = _module_file(name)
        if path is not None:
            todo += sorted(module_imports(path) - seen)
    files = {_module_file(n) for n in seen}
    return {p.relative_to(REPO).as_posix() for p in files if p is not None}


def code_deps(entry_module: str) -> set[str]:
    """A stage's code deps (dvc.yaml): the closure of its entry module without the output-neutral
    modules (``pipeline.lineage.provenance.OUTPUT_NEUTRAL``: they only log, so editing them reruns nothing)."""
    from pipeline.lineage.provenance import OUTPUT_NEUTRAL

    return closure(entry_module, OUTPUT_NEUTRAL)


def stage_modules() -> dict[str, str]:
    """``{stage: entry module}`` from each stage's ``cmd`` (``python -m stages.x ...``)."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    out = {}
    for name, stage in stages.items():
        stage = stage.get("do", stage)  # a foreach stage: its template
        m = re.search(r"python -m ([\w.]+)", stage["cmd"])
        assert m, f"dvc.yaml: stage {name}: cmd {stage['cmd']!r} is not `python -m stages.<module>`"
        out[name] = m.group(1)
    return out
