"""Byte-identical rebuild, end to end ("reproducible by construction").

Two independent copies of the repo (same code, same tiny params, different directories, no shared
DVC cache or outputs, MLflow on with each copy's own SQLite store) run the whole DAG: copy A with
``dvc repro``, copy B with ``dvc repro --force``. Then every output of every stage (the ``outs`` of
both dvc.lock files, directories walked file by file) is compared:

* by default the sha256 of the file's bytes (raw parts, clean text, tokenizer, every shard and
  the manifests, the fine-tuning tokenizer copy, plots, reports ...);
* ``*.pt`` checkpoints (pre-trained ``last.pt``/``best.pt``, fine-tuned ``model.pt``) by a
  canonical hash of their loaded contents, not their bytes: a torch.save zip names its records
  after the (random) temporary file name it was written to and the checkpoints hold wall-clock
  timings (see ``EXCLUDED``). Tensors enter the hash as name, dtype, shape and raw bytes, in
  state-dict order (``pipeline.pretrain.loop.model_sha256``'s recipe): weights, optimizer moments and
  RNG states must be bit-identical. The failure message also prints the weights-only hash;
* files that legitimately hold timings, run ids or dates are compared with exactly the fields
  listed in ``EXCLUDED`` removed (JSON keys at any depth, CSV columns, Markdown text by regex);
  a hash that one output records of another (a record's sha256 of ``best.pt``, a ``dvc.lock``
  md5) may differ only when the output it names compared equal.

A difference fails naming every file that differs (and both hashes). Scope: same machine,
CPU, same torch version and thread count (docs/reproducibility.md). Runtime: 70-95 s on
2 cores (two DAG builds; the comparison takes about a second).
"""

from __future__ import annotations

import csv
import fnmatch
import hashlib
import io
import json
import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import empty_mlflow_store
from tests.support.dag import dag_env, link_shared, run, template_repo

# What may differ between two builds, and why: {output glob (repo-relative): {field: reason}}.
# A field is, for JSON files and checkpoints, a key path ("a/b", list items by index, fnmatch
# wildcards) removed wherever it occurs (at any depth); for CSV files a column; for Markdown a
# regular expression whose matches are blanked. Everything else must be identical; a hash recorded
# in an output (a record's sha256 of best.pt, a dvc.lock md5 ...) may differ only when it is the
# hash of another output that itself compared equal here (see ``compare``).
_RUN = {
    "started": "UTC time the stage started (wall clock)",
    "finished": "UTC time the record was written (wall clock)",
    "pipeline_run_id": "id of the `dvc repro` process: its pid and start time",
    "mlflow_run_id": "MLflow's random run id",
    "seconds": "the stage's wall time so far (checkpoints carry their run's fields, docs/provenance.md)",
    "host": "the machine's name",
    "embedding_init/seconds": "wall time of the skip-gram vectors (pretrain.embedding_init)",
}
EXCLUDED: dict[str, dict[str, str]] = {
    "data/pretrain/*.pt": {
        **_RUN,  # in the embedded provenance records
        "train_seconds": "wall-clock training time (the resume point of a time budget)",
        "history/*/seconds": "loss curve: wall-clock time of each row",
        "history/*/tokens_per_s": "loss curve: throughput",
    },
    "data/finetune/model.pt": _RUN,  # in the embedded provenance records
    "data/variants/*/model.pt": _RUN,
    "metrics/pretrain.json": {"tok_per_s": "throughput"},
    "reports/pretrain.json": {
        "train_seconds": "wall-clock training time",
        "tokens_per_s": "throughput",
        "steps_per_s": "throughput",
        "mfu": "model FLOPs utilisation, from wall time",
        "embedding_init_seconds": "wall time of the skip-gram vectors",
    },
    "reports/finetune.json": {
        "cpu_minutes": "CPU time",
        "wall_minutes": "wall time",
        "per_seed/*/cpu_seconds": "CPU time",
        "per_seed/*/wall_seconds": "wall time",
    },
    "reports/variants/*.json": {
        "cpu_minutes": "CPU time",
        "wall_minutes": "wall time",
        "per_seed/*/cpu_seconds": "CPU time",
        "per_seed/*/wall_seconds": "wall time",
    },
    "plots/pretrain_loss.csv": {"seconds": "wall-clock time of each row", "tokens_per_s": "throughput"},
    "plots/pretrain_val.csv": {"seconds": "wall-clock time of each row"},
    "reports/evaluation.md": {
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d": "provenance table: each record's `finished` time"
    },
    "reports/scorecard.json": {
        "this_run/date": "the day the run was evaluated",
        "this_run/dag_minutes": "wall time of the DAG (from the records' times)",
        "this_run/pretrain_minutes": "wall-clock training time",
    },
    "reports/plots.html": {
        r"(plots/pretrain_(loss|val)\.csv</code> sha256 <code>)[0-9a-f]{12}": "the hash of a loss-curve CSV, whose timing columns differ (compared above without them)",
        r"(the current one is best\.pt )[0-9a-f]{12}, last\.pt [0-9a-f]{12}": "a stale learning curve's note names the current checkpoints, whose bytes hold timings "
        "(the weights are compared above by model_sha256)",
    },
    "reports/scorecard.md": {
        r"\| (none|[0-9.]+ min( \w+)?) \|": "minutes: this run's pre-training and DAG wall "
        "time (a pre-training that rounds to 0.0 min is shown as 'none')",
        r"\| [0-9.]+ \|\n": "fine-tuning variants: each one's wall minutes (last column)",
    },
}

# Stages whose dvc.lock entries must be byte-identical between the two builds: records and reports
# hold no times or run ids (those go to runs/<stage>.json and MLflow, docs/provenance.md), so a
# rebuild of the same data is no lock diff. (Checkpoints still hold their wall-clock fields.)
DATA_STAGES = ("download", "clean", "tokenizer", "examples", "validate")

# Outputs compared by their loaded contents (canonical tensor hash), not their bytes.
TORCH_FILES = ("*.pt",)


# --------------------------------------------------------------------------------------------
# Comparing outputs


def _lock_outs(root: Path) -> dict[str, str]:
    """``{out path: md5}`` of every stage in dvc.lock."""
    stages = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
    return {o["path"]: o.get("md5", "") for entry in stages.values() for o in entry.get("outs") or []}


def _outputs(root: Path) -> dict[str, Path]:
    """Every file under the ``outs`` of dvc.lock (directories walked), by repo-relative path."""
    files = {}
    for out in _lock_outs(root):
        path = root / out
        for f in sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]:
            files[f.relative_to(root).as_posix()] = f
    return files


def _excluded(rel: str) -> set[str]:
    return {field for pattern, fields in EXCLUDED.items() if fnmatch.fnmatch(rel, pattern) for field in fields}


def _dropped(path: str, drop: set[str]) -> bool:
    return any(fnmatch.fnmatchcase(path, p) or fnmatch.fnmatchcase(path, "*/" + p) for p in drop)


def _tensor_hash(t) -> str:
    import torch

    t = t.detach().cpu().contiguous()
    h = hashlib.sha256(f"{t.dtype}:{tuple(t.shape)};".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _canonical(obj: Any, drop: set[str], path: str = "") -> Any:
    """A JSON-able form of a loaded JSON document or checkpoint: ``drop`` key paths removed, tensors
    replaced by the hash of their dtype, shape and bytes, floats by their exact repr, order kept."""
    import torch

    join = lambda k: f"{path}/{k}" if path else str(k)  # noqa: E731
    if isinstance(obj, dict):
        return [[str(k), _canonical(v, drop, join(k))] for k, v in obj.items() if not _dropped(join(k), drop)]
    if isinstance(obj, (list, tuple)):
        return [_canonical(v, drop, join(i)) for i, v in enumerate(obj)]
    if isinstance(obj, torch.Tensor):
        return {"tensor": _tensor_hash(obj)}
    if isinstance(obj, float):
        return {"float": repr(obj)}
    return obj


def _weights_hash(ckpt: dict) -> str:
    """pipeline.pretrain.loop.model_sha256's recipe on a loaded state dict: names, dtypes, shapes, bytes, in order."""
    import torch

    h = hashlib.sha256()
    for name, t in ckpt["model"].items():
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _comparable(rel: str, path: Path) -> tuple[str, str | None, str]:
    """(how the file is compared, its comparable text (None: bytes only), a label for messages)."""
    drop = _excluded(rel)
    if any(fnmatch.fnmatch(rel, p) for p in TORCH_FILES):
        import torch

        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        return (
            "canonical checkpoint hash" + (" without the excluded fields" if drop else ""),
            json.dumps(_canonical(ckpt, drop), ensure_ascii=False),
            f"weights {_weights_hash(ckpt)[:16]}",
        )
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return "sha256", None, ""
    if not drop:
        return "sha256", text, ""
    if path.suffix == ".json":
        return "sha256 without the excluded fields", json.dumps(_canonical(json.loads(text), drop)), ""
    if path.suffix == ".csv":
        rows = list(csv.reader(io.StringIO(text)))
        keep = [i for i, name in enumerate(rows[0] if rows else []) if name not in drop]
        return "sha256 without the excluded columns", json.dumps([[r[i] for i in keep if i < len(r)] for r in rows]), ""
    if path.suffix in (".md", ".html"):
        for pattern in drop:
            text = re.sub(pattern, "<excluded>", text)
        return "sha256 without the excluded text", text, ""
    raise AssertionError(f"{rel}: EXCLUDED lists fields for a file type this test cannot filter")


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def compare(a: Path, b: Path) -> tuple[dict[str, str], list[str]]:
    """``({file: how it compared equal}, [one line per difference])`` for the outputs of two builds.

    A file whose bytes differ but whose comparable form (``EXCLUDED`` fields removed) is equal makes
    its sha256 and md5 in B equivalent to A's; so does a dvc.lock directory whose files are all equal.
    Equivalent hashes are replaced (B → A) in the other files before they are compared, until nothing
    changes: a record may name a checkpoint's sha256, never anything else that differs.
    """
    files_a, files_b = _outputs(a), _outputs(b)
    problems = [f"{rel}: only in copy {'A' if rel in files_a else 'B'}" for rel in sorted(set(files_a) ^ set(files_b))]
    common = sorted(set(files_a) & set(files_b))
    digests = {
        rel: {
            side: (hashlib.sha256(f.read_bytes()).hexdigest(), hashlib.md5(f.read_bytes()).hexdigest())
            for side, f in (("A", files_a[rel]), ("B", files_b[rel]))
        }
        for rel in common
    }
    equal = {rel: "byte-identical" for rel in common if digests[rel]["A"] == digests[rel]["B"]}
    forms = {
        rel: (_comparable(rel, files_a[rel]), _comparable(rel, files_b[rel])) for rel in common if rel not in equal
    }
    same: dict[str, str] = {}  # hash in B -> equivalent hash in A
    lock_a, lock_b = _lock_outs(a), _lock_outs(b)

    def substituted(text: str) -> str:
        for hb, ha in same.items():
            text = text.replace(hb, ha)
        return text

    changed = True
    while changed:
        changed = False
        for rel, ((how, text_a, _), (_, text_b, _)) in forms.items():
            if rel in equal or text_a is None or text_b is None:
                continue
            if _sha(substituted(text_a)) == _sha(substituted(text_b)):
                equal[rel] = how
                same.update({hb: ha for ha, hb in zip(digests[rel]["A"], digests[rel]["B"]) if ha != hb})
                changed = True
        for out, md5_a in lock_a.items():  # a directory out whose files are all equal
            md5_b = lock_b.get(out, "")
            inside = [rel for rel in common if rel == out or rel.startswith(out + "/")]
            if md5_a != md5_b and md5_b and inside and all(r in equal for r in inside):
                key_b, key_a = md5_b.removesuffix(".dir"), md5_a.removesuffix(".dir")
                if same.get(key_b) != key_a:
                    same[key_b] = key_a
                    changed = True
    for rel, ((how, text_a, label_a), (_, text_b, label_b)) in forms.items():
        if rel not in equal:
            ha, hb = (
                (_sha(substituted(text_a)), _sha(substituted(text_b)))
                if text_a is not None and text_b is not None
                else (digests[rel]["A"][0], digests[rel]["B"][0])
            )
            problems.append(f"{rel}: {how} differs: A {ha} {label_a} != B {hb} {label_b}".rstrip())
    return equal, problems


@pytest.mark.slow
def test_two_clean_builds_write_identical_outputs(tmp_path):
    t0 = time.perf_counter()
    template = template_repo(tmp_path / "template" / "repo")
    a, b = tmp_path / "a" / "repo", tmp_path / "b" / "repo"  # different absolute paths on purpose
    for dst in (a, b):
        shutil.copytree(template, dst, symlinks=True)
        link_shared(dst)
        empty_mlflow_store(dst.parent / "mlflow.db")  # each copy's store (_env), its schema already made
    out_a = run(["dvc", "repro"], a, dag_env(a))
    out_b = run(["dvc", "repro", "--force"], b, dag_env(b))
    from pipeline.lineage.provenance import dvc_stages

    stages = set(dvc_stages(a))
    for out in (out_a, out_b):
        assert set(re.findall(r"Running stage '([^']+)'", out.stdout + out.stderr)) == stages, out.stdout
    built = time.perf_counter() - t0
    stale = [pattern for pattern in EXCLUDED if not any(fnmatch.fnmatch(rel, pattern) for rel in _outputs(a))]
    assert not stale, f"EXCLUDED names outputs the DAG no longer writes: {stale}; update the list"
    equal, problems = compare(a, b)
    print(
        f"\nrebuild-identical: two builds {built:.0f} s, total {time.perf_counter() - t0:.0f} s; "
        f"{len(equal)} of {len(_outputs(a))} output files equal:"
    )
    for rel, how in sorted(equal.items()):
        print(f"  {rel}: {how}")
    locks = {side: yaml.safe_load((root / "dvc.lock").read_text())["stages"] for side, root in (("A", a), ("B", b))}
    churn = [s for s in DATA_STAGES if locks["A"][s] != locks["B"][s]]
    assert not churn, f"dvc.lock entries of {churn} differ between two builds of the same data: " + "; ".join(
        f"{s}: A {locks['A'][s]} != B {locks['B'][s]}" for s in churn
    )
    assert not problems, (
        f"{len(problems)} output(s) differ between two clean builds (an output that records the "
        "hash of a differing one differs too):\n" + "\n".join(problems)
    )


@pytest.mark.parametrize("change", [None, "shard", "weights", "timing-free metric"])
def test_compare_names_every_file_that_differs(tmp_path, change):
    """The comparer itself (fast): excluded fields and hashes of equal outputs pass; anything else
    fails naming the file, including a record that names a checkpoint whose contents changed."""
    import torch

    def build(root: Path, side: str) -> None:
        weights = torch.arange(6.0) + (1.0 if side == "B" and change == "weights" else 0.0)
        ckpt = root / "data/pretrain/last.pt"
        ckpt.parent.mkdir(parents=True)
        torch.save(
            {
                "model": {"w": weights},
                "train_seconds": 1.0 if side == "A" else 2.5,
                "provenance": {"started": side, "upstream": {"x": {"mlflow_run_id": side}}},
            },
            ckpt,
        )
        shard = root / "data/examples/train/shard-00000.parquet"
        shard.parent.mkdir(parents=True)
        shard.write_bytes(b"PAR1" + (b"\x01" if side == "B" and change == "shard" else b"\x00"))
        sha = hashlib.sha256(ckpt.read_bytes()).hexdigest()
        (root / "data/provenance").mkdir(parents=True)
        (root / "data/provenance/pretrain.json").write_text(
            json.dumps({"outputs": {"data/pretrain/last.pt": sha}, "params_hash": "p" * 64})
        )
        (root / "reports").mkdir()
        (root / "reports/pretrain.json").write_text(
            json.dumps(
                {
                    "train_seconds": 1.0 if side == "A" else 2.0,
                    "loss": 0.5 if side == "A" or change != "timing-free metric" else 0.25,
                }
            )
        )
        outs = {
            "data/examples": f"{side * 32}.dir",
            "data/pretrain": f"{side.lower() * 32}.dir",
            "data/provenance/pretrain.json": "",
            "reports/pretrain.json": "",
        }
        (root / "dvc.lock").write_text(
            yaml.safe_dump(
                {"schema": "2.0", "stages": {"s": {"outs": [{"path": p, "md5": m} for p, m in outs.items()]}}}
            )
        )

    a, b = tmp_path / "a", tmp_path / "b"
    for root, side in ((a, "A"), (b, "B")):
        build(root, side)
    equal, problems = compare(a, b)
    expected = {
        None: [],
        "shard": ["data/examples/train/shard-00000.parquet"],
        "weights": ["data/pretrain/last.pt", "data/provenance/pretrain.json"],
        "timing-free metric": ["reports/pretrain.json"],
    }[change]
    assert [p.split(":")[0] for p in problems] == expected, problems
    assert all(" A " in p and " != B " in p for p in problems)
    if change is None:
        assert equal["data/pretrain/last.pt"].startswith("canonical checkpoint hash")
        assert equal["data/provenance/pretrain.json"] == "sha256"  # equal once the checkpoint's hash is substituted
