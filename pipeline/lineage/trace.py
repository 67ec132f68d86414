"""Lineage of a model: the chain of stages, code versions and data hashes behind a checkpoint.

``lineage(target)`` reads the provenance behind ``target`` and flattens the nested records into
a chain, newest first::

    evaluate → finetune → pretrain → examples → tokenizer → clean → download

(whichever are present); a fine-tuned published checkpoint (``pipeline/interop/hf_import.py``) ends in an
``imported`` record instead: "imported from <source>@<revision>" and the sha256 of every file read. ``target`` may be

* a checkpoint (fine-tuned ``model.pt``, pre-training ``best.pt`` / ``last.pt``): the chain is
  embedded in it, so this works on a machine that has nothing but the checkpoint;
* a provenance record (``data/provenance/<stage>.json``);
* an exported directory: a Hugging Face export (``bertrace_export.json``) or a downloaded
  MLflow model (``MLmodel`` + ``artifacts/model.pt``);
* an MLflow run id, ``runs:/<run id>/model``, ``models:/<name>/<version>``, ``models:/<name>@<alias>``
  or ``models:/<model id>``: the record is the run's ``provenance/<stage>.json`` artifact.

Verification (:mod:`pipeline.lineage.trace_verify`) rechecks every link; rendering as text is
:mod:`pipeline.lineage.trace_render`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Iterator

import yaml

from pipeline.core.errors import BertraceError
from pipeline.core.io import sha256_file
from pipeline.lineage.provenance import STAGE_ORDER, iter_records, record_digest
from pipeline.lineage.runlog import CHECKPOINT_RECORD_TAG, RECORD_TAG, read_run_log, with_run

EXPORT_INFO = "bertrace_export.json"  # pipeline.interop.export.EXPORT_INFO (not imported: export imports transformers)
_RUN_ID = re.compile(r"^[0-9a-f]{32}$")
_FORMS = (
    "give a checkpoint (data/finetune/model.pt, data/pretrain/best.pt), a provenance record "
    "(data/provenance/<stage>.json), an exported directory, or an MLflow run id / runs:/<id>/model / "
    "models:/<name>/<version>"
)


# --------------------------------------------------------------------------------------------
# Reading the target


def _read_record(path: Path) -> dict[str, Any]:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BertraceError(
            f"{path}: not valid JSON ({e}); rerun the stage that writes it or restore it with `dvc checkout`"
        ) from None
    if not isinstance(record, dict):
        raise BertraceError(f"{path}: not a bertrace provenance record (no 'stage' field)")
    return record


def _checkpoint(path: Path) -> tuple[str, dict[str, Any]]:
    from pipeline.models.checkpoint import read_checkpoint  # imports torch: only for checkpoints

    ckpt = read_checkpoint(path)
    record = ckpt.get("provenance")
    if not isinstance(record, dict) or not record:
        raise BertraceError(
            f"{path}: checkpoint has no provenance record; it was not written by a "
            "bertrace stage (rerun `dvc repro` to get a traceable one)"
        )
    return ("fine-tuned checkpoint" if "num_labels" in ckpt else "pre-training checkpoint"), record


def _mlmodel_checkpoint(mlmodel: dict[str, Any]) -> tuple[str | None, str | None]:
    """(relative path of the checkpoint inside an MLflow model, its recorded sha256)."""
    artifacts = ((mlmodel.get("flavors") or {}).get("python_function") or {}).get("artifacts") or {}
    path = (artifacts.get("checkpoint") or {}).get("path")
    return path, (mlmodel.get("metadata") or {}).get("bertrace_checkpoint_sha256")


def _load_path(target: Path) -> dict[str, Any]:
    """``{kind, record, target_sha256, checks}`` of a file or exported directory."""
    if target.is_dir():
        if (target / EXPORT_INFO).is_file():
            return _load_export(target / EXPORT_INFO, target)
        if (target / "MLmodel").is_file():
            mlmodel = yaml.safe_load((target / "MLmodel").read_text(encoding="utf-8")) or {}
            rel, recorded = _mlmodel_checkpoint(mlmodel)
            if not rel or not (target / rel).is_file():
                raise BertraceError(
                    f"{target}: MLflow model without a bertrace checkpoint (artifacts/model.pt); "
                    "give a model logged by the evaluate stage"
                )
            kind, record = _checkpoint(target / rel)
            checks = (
                [
                    {
                        "what": "checkpoint in the MLflow model",
                        "path": (target / rel).resolve().as_posix(),
                        "recorded": recorded,
                    }
                ]
                if recorded
                else []
            )
            return {
                "kind": f"MLflow model directory (run {mlmodel.get('run_id')})",
                "record": record,
                "target_sha256": sha256_file(target / rel),
                "checks": checks,
            }
        raise BertraceError(f"{target}: a directory without {EXPORT_INFO} or MLmodel; {_FORMS}")
    if target.suffix == ".json":
        record = _read_record(target)
        if target.name == EXPORT_INFO:
            return _load_export(target, target.parent)
        if not isinstance(record.get("stage"), str):
            raise BertraceError(f"{target}: not a bertrace provenance record (no 'stage' field)")
        return {"kind": "provenance record", "record": record, "target_sha256": sha256_file(target), "checks": []}
    kind, record = _checkpoint(target)
    return {"kind": kind, "record": record, "target_sha256": sha256_file(target), "checks": []}


def _load_export(info_path: Path, directory: Path) -> dict[str, Any]:
    info = _read_record(info_path)
    record = info.get("provenance")
    if not isinstance(record, dict) or not record:
        raise BertraceError(
            f"{info_path}: the export carries no provenance; export again from a checkpoint "
            "written by the pipeline (`bertrace export --hf DIR --checkpoint data/finetune/model.pt`)"
        )
    checks = []
    if info.get("source_checkpoint") and info.get("source_sha256"):
        checks.append(
            {"what": "exported from", "path": str(info["source_checkpoint"]), "recorded": info["source_sha256"]}
        )
    return {
        "kind": f"Hugging Face export of {info.get('source_checkpoint')}",
        "record": record,
        "target_sha256": info.get("source_sha256"),
        "checks": checks,
    }


@contextlib.contextmanager
def quiet_mlflow() -> Iterator[None]:
    """No artifact download progress bars while we fetch small files."""
    key, old = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", os.environ.get("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR")
    os.environ[key] = "false"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


def _load_mlflow(target: str, root: Path) -> dict[str, Any]:
    """The provenance record of an MLflow run (by id, ``runs:/`` or ``models:/`` URI)."""
    import mlflow.artifacts
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from pipeline.lineage.mlflow_store import tracking_uri

    uri = tracking_uri(root)
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :]).is_file():
        raise BertraceError(
            f"{uri[len('sqlite:///') :]}: no MLflow store there; run from the repository root, "
            "pass --root, or set MLFLOW_TRACKING_URI to the store the run was logged to"
        )
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    model_base = None  # artifact URI of an MLflow model, for its checkpoint sha256
    try:
        if target.startswith("runs:/"):
            run_id, _, sub = target[len("runs:/") :].partition("/")
            if sub.strip("/"):
                model_base = _run_model_location(client, run_id, sub.strip("/"))
        elif target.startswith("models:/"):
            ref = target[len("models:/") :].strip("/")
            if "@" in ref or "/" in ref:
                name, sep, which = ref.partition("@") if "@" in ref else ref.rpartition("/")
                mv = (
                    client.get_model_version_by_alias(name, which)
                    if sep == "@"
                    else client.get_model_version(name, which)
                )
                run_id = mv.run_id
                source = str(mv.source or "")
                model_id = getattr(mv, "model_id", None) or (
                    source[len("models:/") :] if source.startswith("models:/") else None
                )  # MLflow 3: a LoggedModel
                model_base = client.get_logged_model(model_id).artifact_location if model_id else source
            else:
                logged = client.get_logged_model(ref)
                run_id, model_base = logged.source_run_id, logged.artifact_location
        else:
            run_id = target
        run = client.get_run(run_id)
        tags = run.data.tags
        if "bertrace.stage" not in tags:
            raise BertraceError(f"MLflow run {run_id}: not a bertrace stage run (no bertrace.stage tag)")
        if "bertrace.provenance_artifact" not in tags and tags.get("mlflow.parentRunId"):
            run = client.get_run(tags["mlflow.parentRunId"])  # a per-seed child: its stage run has the record
            tags = run.data.tags
        artifact = tags.get("bertrace.provenance_artifact") or f"{tags['bertrace.stage']}.json"
        with tempfile.TemporaryDirectory(prefix="bertrace-trace-") as tmp, quiet_mlflow():
            try:
                local = Path(client.download_artifacts(run.info.run_id, artifact, tmp))
            except (MlflowException, OSError):
                raise BertraceError(
                    f"MLflow run {run.info.run_id} ({tags['bertrace.stage']}): no provenance "
                    f"artifact {artifact}; the stage failed before writing it, rerun it"
                ) from None
            record = _read_record(local)
            checks, target_sha = [], None
            if model_base:
                mlmodel_path = Path(
                    mlflow.artifacts.download_artifacts(
                        artifact_uri=f"{model_base}/MLmodel", dst_path=tmp, tracking_uri=uri
                    )
                )
                mlmodel = yaml.safe_load(mlmodel_path.read_text(encoding="utf-8")) or {}
                rel, target_sha = _mlmodel_checkpoint(mlmodel)
                if rel and target_sha:
                    checks.append(
                        {
                            "what": "checkpoint in the MLflow model",
                            "path": f"{model_base}/{rel}",
                            "recorded": target_sha,
                            "mlflow_uri": uri,
                        }
                    )
    except MlflowException as e:
        raise BertraceError(
            f"{target}: not found in the MLflow store {uri} ({e.message.splitlines()[0]}); "
            "check the id or set MLFLOW_TRACKING_URI"
        ) from None
    kind = f"MLflow run {run.info.run_id} ({tags['bertrace.stage']})"
    if model_base:
        kind = f"MLflow model of run {run.info.run_id} ({tags['bertrace.stage']})"
    return {"kind": kind, "record": record, "target_sha256": target_sha, "checks": checks}


def _run_model_location(client, run_id: str, name: str) -> str:
    """Artifact location of the model ``name`` logged by run ``run_id`` (``runs:/<id>/<name>``)."""
    run = client.get_run(run_id)
    with contextlib.suppress(AttributeError):  # MLflow 3: models are LoggedModels of the run
        found = client.search_logged_models(
            [run.info.experiment_id], filter_string=f"source_run_id = '{run_id}' AND name = '{name}'"
        )
        if len(found):
            return found[0].artifact_location
    return f"{run.info.artifact_uri}/{name}"  # MLflow 2: a folder of the run's artifacts


def corpus_source(rec: dict[str, Any]) -> str | None:
    """Where the download stage's corpus came from: hub id + revision, or local path."""
    src = rec.get("source") if isinstance(rec.get("source"), dict) else None
    params = rec.get("params") if isinstance(rec.get("params"), dict) else {}
    if src and src.get("type") == "hub" or not src and params.get("source", "hub") == "hub" and params.get("hub"):
        hub = src or params.get("hub") or {}
        rev = (src or {}).get("resolved_revision") or hub.get("revision") or "main"
        text = f"hub {hub.get('dataset')} {hub.get('config') or ''} @ {rev}".replace("  ", " ")
        return text + (f" (through the mirror {rec['mirror']})" if rec.get("mirror") else "")
    if params.get("source") == "local":
        return f"local {(params.get('local') or {}).get('path')}"
    return None


def imported_source(rec: dict[str, Any]) -> str:
    """``<source>@<revision>`` of a published checkpoint's root record (pipeline/interop/hf_import.py)."""
    rev = rec.get("resolved_revision") or rec.get("revision")
    return f"{rec.get('source')}@{rev}" if rev else f"{rec.get('source')} (local directory)"


def _node(name: str, rec: dict[str, Any]) -> dict[str, Any]:
    git = rec.get("git") if isinstance(rec.get("git"), dict) else {}
    return {
        "stage": name,
        "run_known": isinstance(rec.get("git"), dict) or bool(rec.get("finished")),  # which run made it
        "git_commit": git.get("commit"),
        "git_dirty": git.get("dirty"),
        "dirty_paths": list(git.get("dirty_paths") or []),
        "experiment": git.get("experiment") if isinstance(git.get("experiment"), dict) else None,  # dvc exp run
        "params_hash": rec.get("params_hash"),
        "params": rec.get("params") if isinstance(rec.get("params"), dict) else None,
        "budget": rec.get("budget") if isinstance(rec.get("budget"), dict) else None,  # pretrain
        "started": rec.get("started"),
        "finished": rec.get("finished"),
        "pipeline_run_id": rec.get("pipeline_run_id"),
        "mlflow_run_id": rec.get("mlflow_run_id"),
        "source": corpus_source(rec) if name == "download" else imported_source(rec) if name == "imported" else None,
        "inputs": {str(k): v for k, v in (rec.get("inputs") or {}).items() if isinstance(v, str)},
        "outputs": {str(k): v for k, v in (rec.get("outputs") or {}).items() if isinstance(v, str)},
        "dvc_outs": {},  # path -> md5 in dvc.lock, as a downstream stage saw it
        "compute": _compute(rec)
        if name == "pretrain"
        else None,  # what its bytes depend on beyond commit, params, data
    }


def _compute(rec: dict[str, Any]) -> dict[str, Any]:
    """Where a pre-training run's weights were computed: device, precision, torch build, CPU
    threads, processes: its bytes depend on these too (docs/provenance.md "Same bytes on another
    machine"). A checkpoint's embedded record has them all; a stage record
    (``data/provenance/pretrain.json``) has no device or precision (``None``: not recorded)."""
    det = rec.get("determinism") if isinstance(rec.get("determinism"), dict) else {}
    plat = rec.get("platform") if isinstance(rec.get("platform"), dict) else {}
    libs = rec.get("libraries") if isinstance(rec.get("libraries"), dict) else {}
    return {
        "device": rec.get("device"),
        "precision": rec.get("precision"),
        "torch": rec.get("torch") or libs.get("torch"),
        "num_threads": det.get("num_threads", rec.get("num_threads")),
        "world_size": rec.get("world_size"),
        "machine": plat.get("machine"),
        "system": plat.get("system"),
        "arithmetic": rec.get("arithmetic") if isinstance(rec.get("arithmetic"), dict) else None,
    }


class _RunLogs:
    """The run log of a record (when, where, by which runs it was made; pipeline/lineage/provenance.py):
    ``runs/<stage>.json`` under ``root`` when it belongs to the record, else the ``provenance/run.json``
    artifact of the MLflow run tagged with the record's digest (a teammate's run on a shared
    server), else None. A record that carries its run fields (a checkpoint's) needs neither."""

    def __init__(self, root: Path):
        self.root, self._client, self._experiments = root, None, None

    def find(self, stage: str, rec: dict[str, Any]) -> dict[str, Any] | None:
        if rec.get("started") or rec.get("record_version", 1) < 2:
            return None
        return read_run_log(stage, rec, self.root) or self._from_mlflow(record_digest(rec))

    def _from_mlflow(self, digest: str) -> dict[str, Any] | None:
        if self._client is None:
            self._client = self._connect()
        if not self._client:
            return None
        for tag in (RECORD_TAG, CHECKPOINT_RECORD_TAG):  # the stage's record, or the one its checkpoints embed
            with contextlib.suppress(Exception), quiet_mlflow():
                runs = self._client.search_runs(
                    self._experiments,
                    filter_string=f"tags.`{tag}` = '{digest}'",
                    order_by=["attributes.start_time DESC"],
                    max_results=1,
                )
                if runs:
                    with tempfile.TemporaryDirectory(prefix="bertrace-trace-") as tmp:
                        local = self._client.download_artifacts(runs[0].info.run_id, "provenance/run.json", tmp)
                        log = json.loads(Path(local).read_text(encoding="utf-8"))
                    if isinstance(log, dict) and digest in (
                        log.get("record_sha256"),
                        log.get("checkpoint_record_sha256"),
                    ):
                        return log
        return None

    def _connect(self):
        """An MLflow client of the store the runs were logged to, or False (none, or not answering:
        a trace works offline and shows ``-`` for when)."""
        from pipeline.lineage.mlflow_store import check_server, tracking_uri

        uri = tracking_uri(self.root)
        if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :]).is_file():
            return False
        try:
            check_server(uri, timeout=3.0)
            from mlflow import MlflowClient

            client = MlflowClient(tracking_uri=uri)
            self._experiments = [e.experiment_id for e in client.search_experiments()]
        except Exception:  # noqa: BLE001 - display only
            return False
        return client if self._experiments else False


def repository_root(target: str | os.PathLike) -> Path:
    """The DVC repository a file target lives in (the nearest directory above it holding
    ``dvc.yaml`` or ``.dvc/``), where its records' paths, run logs and default MLflow store are;
    the current directory for anything else (a run id, a file outside any repository)."""
    path = Path(target)
    if path.exists():
        # the link's own folders first: a DVC output symlinked into a cache elsewhere resolves out of the repo
        for folder in [*Path(os.path.abspath(path)).parents, *path.resolve().parents]:
            if (folder / "dvc.yaml").is_file() or (folder / ".dvc").is_dir():
                return folder.resolve()
    return Path(".")


def lineage(target: str | os.PathLike, root: str | os.PathLike = ".") -> dict[str, Any]:
    """The stages behind ``target``, newest first.

    Returns ``{target, kind, target_sha256, chain: [node, ...], conflicts: [...], checks: [...]}``;
    each node is ``{stage, git_commit, git_dirty, dirty_paths, params_hash, params, started,
    finished, pipeline_run_id, mlflow_run_id, record_sha256, source, budget (pretrain: its budget record, with
    ``extends`` when it continued another budget's run), inputs {path: sha256}, outputs
    {path: sha256}, dvc_outs {path: md5}}``. A stage embedded more than once (clean via tokenizer
    and via examples) is listed once, from its most downstream occurrence; if the copies disagree (different
    params or hashes) it is named in ``conflicts``. ``root`` locates the MLflow store for run
    ids and URIs (``MLFLOW_TRACKING_URI`` wins). Plain JSON: ``json.loads(json.dumps(x)) == x``.
    """
    text = os.fspath(target)
    path = Path(text)
    if path.exists():
        loaded = _load_path(path)
    elif text.startswith(("runs:/", "models:/")) or _RUN_ID.match(text):
        loaded = _load_mlflow(text, Path(root))
    else:
        raise BertraceError(f"{target}: not found; {_FORMS}")
    record = loaded["record"]
    nodes: dict[str, dict[str, Any]] = {}
    conflicts: list[str] = []
    dvc_outs: dict[str, dict[str, str]] = {}
    run_logs = _RunLogs(Path(root))
    for name, rec in iter_records(record, record.get("stage")):
        node = _node(name, with_run(rec, run_logs.find(name, rec)))
        node["record_sha256"] = record_digest(rec)  # its record without the code identity (what a checkpoint embeds)
        if name not in nodes:
            nodes[name] = node
        elif (nodes[name]["params_hash"], nodes[name]["inputs"], nodes[name]["outputs"]) != (
            node["params_hash"],
            node["inputs"],
            node["outputs"],
        ) and name not in conflicts:
            conflicts.append(name)
        for up, entry in (rec.get("dvc_lock") or {}).items():
            if isinstance(entry, dict) and up not in dvc_outs:  # provenance records: embedded already
                dvc_outs[up] = {
                    p: m
                    for p, m in (entry.get("outs") or {}).items()
                    if isinstance(m, str) and not p.startswith("data/provenance/")
                }
    for up, outs in dvc_outs.items():
        if up in nodes:
            nodes[up]["dvc_outs"] = outs
    order = {s: i for i, s in enumerate(STAGE_ORDER)}
    order["finetune_variant"] = order["finetune"]  # finetune_variant@<name>: a fine-tuning, in the same place
    chain = sorted(nodes.values(), key=lambda n: order.get(str(n["stage"]).split("@")[0], len(order)))
    return {
        "target": path.as_posix() if path.exists() else text,
        "kind": loaded["kind"],
        "target_sha256": loaded["target_sha256"],
        "chain": chain,
        "conflicts": conflicts,
        "checks": loaded["checks"],
    }
