"""dvc.yaml's code dependencies are exactly the import closure of each stage's entry point, less
the output-neutral modules (``pipeline.lineage.provenance.OUTPUT_NEUTRAL``: MLflow runs and tags, run logs).

`dvc repro` reruns a stage when a file in its ``deps`` changes, so a module the stage imports but
does not list lets an edit go unnoticed, and a listed file it never imports reruns it for nothing.
The closure is computed from the real imports (``ast``: every ``import`` / ``from ... import`` of a
``pipeline`` or ``stages`` module anywhere in a file, function-level imports included, plus the
packages' ``__init__.py``), starting at the module in the stage's ``cmd``. An output-neutral module is neither counted nor
followed: it only reports, so editing it must rerun nothing (``dvc status`` stays clean), and it
writes no DVC output (checked below).

On a failure the message names the stage and the file; ``python tests/unit/test_dvc_deps.py --write``
rewrites the code deps of every stage in dvc.yaml (other deps and comments are kept).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml

if __name__ == "__main__":  # run as a script: the repository root is the import root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support import import_graph  # noqa: E402
from tests.support.import_graph import REPO, closure, code_deps, stage_modules  # noqa: E402


def listed_code(stage: str) -> set[str]:
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    spec = stages[stage].get("do", stages[stage])  # a foreach stage: its template
    deps = [d if isinstance(d, str) else next(iter(d)) for d in spec.get("deps", [])]
    return {d for d in deps if d.endswith(".py")}


@pytest.mark.parametrize("stage", sorted(stage_modules()))
def test_code_deps_equal_the_import_closure(stage):
    module = stage_modules()[stage]
    need, listed = code_deps(module), listed_code(stage)
    missing, extra = sorted(need - listed), sorted(listed - need)
    assert not missing and not extra, (
        f"dvc.yaml stage {stage!r} (python -m {module}): "
        + (f"imports but does not list {missing}; " if missing else "")
        + (f"lists but never imports {extra}; " if extra else "")
        + "update its deps (python tests/unit/test_dvc_deps.py --write)"
    )


def test_closure_follows_lazy_and_package_imports(tmp_path, monkeypatch):
    """The scanner itself: a function-level import and ``from package import module`` both count."""
    (tmp_path / "pipeline").mkdir()
    (tmp_path / "stages").mkdir()
    for pkg in ("pipeline", "stages"):
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "stages" / "s.py").write_text("from pipeline import a\n\ndef f():\n    import pipeline.b\n")
    (tmp_path / "pipeline" / "a.py").write_text("from pipeline.c import X\nimport os\n")
    (tmp_path / "pipeline" / "b.py").write_text("")
    (tmp_path / "pipeline" / "c.py").write_text("X = 1\n")
    (tmp_path / "pipeline" / "unused.py").write_text("")
    monkeypatch.setattr(import_graph, "REPO", tmp_path)
    assert closure("stages.s") == {
        "stages/__init__.py",
        "stages/s.py",
        "pipeline/__init__.py",
        "pipeline/a.py",
        "pipeline/b.py",
        "pipeline/c.py",
    }


def test_pipeline_modules_of_no_stage_are_the_tools_ones():
    """Modules no stage imports are the CLI/export/bench side; a new module lands in a stage or here."""
    used = set().union(*(closure(m) for m in stage_modules().values()))
    unused = sorted(
        p.relative_to(REPO).as_posix()
        for p in (REPO / "pipeline").rglob("*.py")
        if p.relative_to(REPO).as_posix() not in used
    )
    assert unused == [
        "pipeline/apps/__init__.py",  # apps/ (the demo, generation) is the CLI's only
        "pipeline/apps/demo.py",
        "pipeline/apps/generate.py",
        "pipeline/interop/export.py",
        "pipeline/interop/export_gpt.py",
        "pipeline/interop/export_writer.py",
        "pipeline/interop/hf_gpt.py",
        "pipeline/interop/model_card.py",
        "pipeline/lineage/attestation.py",
        "pipeline/lineage/trace.py",
        "pipeline/lineage/trace_render.py",
        "pipeline/lineage/trace_verify.py",
        "pipeline/reports/learning_curve.py",
        "pipeline/reports/profiles.py",
    ], unused


def test_output_neutral_modules_are_imported_by_stages_and_listed_by_none():
    """The rule has teeth: every stage imports the neutral modules (through stages/common.py), and
    no stage lists them, so an edit of one leaves ``dvc status`` clean (tests/e2e/test_stable_lock.py
    edits one and checks)."""
    from pipeline.lineage.provenance import OUTPUT_NEUTRAL

    files = {name.replace(".", "/") + ".py" for name in OUTPUT_NEUTRAL}
    assert all((REPO / f).is_file() for f in files), files
    for stage, module in stage_modules().items():
        if stage in ("scorecard", "plots"):  # they log nothing to MLflow
            continue
        assert files <= closure(module), f"{stage} no longer imports {sorted(files - closure(module))}"
        assert not files & listed_code(stage), f"dvc.yaml stage {stage} lists {sorted(files & listed_code(stage))}"


def test_the_record_format_is_a_dep_of_every_stage_that_writes_a_record():
    """Records are written through pipeline/lineage/provenance.py (``build_record``, ``RECORD_VERSION``):
    a change of what a record contains reruns every stage that writes one."""
    from pipeline.lineage import provenance

    assert isinstance(provenance.RECORD_VERSION, int)
    for stage, module in stage_modules().items():
        if "StageRun(" not in (REPO / (module.replace(".", "/") + ".py")).read_text(encoding="utf-8"):
            continue  # scorecard, plots: no record
        assert "pipeline/lineage/provenance.py" in listed_code(stage), stage


# Calls that write a file. In an output-neutral module only the run log may be written.
_WRITERS = {"write_json", "atomic_path", "write_text", "write_bytes", "save", "dump", "to_parquet", "savefig"}
_RUN_LOG_WRITER = "write_run_log"


@pytest.mark.parametrize(
    "module", __import__("pipeline.lineage.provenance", fromlist=["OUTPUT_NEUTRAL"]).OUTPUT_NEUTRAL
)
def test_output_neutral_modules_write_no_dvc_output(module):
    import ast

    path = REPO / (module.replace(".", "/") + ".py")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
        for node in ast.walk(fn):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
                if name in _WRITERS and fn.name != _RUN_LOG_WRITER:
                    found.append(f"{fn.name}() calls {name} (line {node.lineno})")
    assert found == [], (
        f"{path.relative_to(REPO)} is output-neutral (pipeline.lineage.provenance.OUTPUT_NEUTRAL) but writes files: {found}; "
        "move the writing into a module the stages depend on"
    )


def write_code_deps(dvc_yaml: Path) -> None:
    """Replace each stage's ``pipeline/`` and ``stages/`` .py deps in ``dvc_yaml`` by its closure."""
    modules = stage_modules()
    code = re.compile(r"^\s+- (pipeline|stages)/\S+\.py\s*(#.*)?$")
    out, stage, in_deps, items = [], None, False, ""
    for line in dvc_yaml.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^  (\w[\w-]*):\s*(#.*)?$", line)
        if m:
            stage, in_deps = m.group(1), False
        deps = re.match(r"^(    |      )deps:\s*$", line)  # a stage's, or a foreach stage's `do:`
        if stage in modules and deps:
            in_deps, items = True, deps.group(1) + "  "
            out.append(line)
            files = sorted(code_deps(modules[stage]), key=lambda p: (not p.startswith("stages/"), p))
            out += [f"{items}- {f}" for f in files]
            continue
        if in_deps and not line.startswith(items):
            in_deps = False
        if in_deps and code.match(line):
            continue
        out.append(line)
    dvc_yaml.write_text("\n".join(out) + "\n", encoding="utf-8")


if __name__ == "__main__":
    if "--write" in sys.argv:
        write_code_deps(REPO / "dvc.yaml")
        print("dvc.yaml: code deps rewritten from the import closure of each stage")
        sys.exit(0)
    for stage, module in stage_modules().items():
        print(f"{stage}:")
        for f in sorted(code_deps(module), key=lambda p: (not p.startswith("stages/"), p)):
            print(f"      - {f}")
