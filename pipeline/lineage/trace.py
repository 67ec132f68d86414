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

``verify(lineage, root)`` checks every link and says ``ok``, ``changed`` or ``missing`` (not
present) for each:

* ``input`` / ``output``: the sha256 of each recorded file under ``root`` (directories with
  :func:`pipeline.lineage.provenance.hash_path`);
* ``link``: a stage's recorded input equals the upstream stage's recorded output;
* ``params``: the stage's section of ``root/params.yaml`` still hashes to the recorded params;
* ``dvc``: the upstream outputs named by the recorded ``dvc.lock`` md5s are in the DVC cache
  (so ``dvc checkout`` can restore them);
* ``target``: the checkpoint inside an export / MLflow model is the one its metadata names;
* ``shard``: each shard listed by a recorded examples manifest (``data/examples/manifest.json``)
  that is itself unchanged, rehashed against the sha256 the manifest records for it (a shard
  rewritten or truncated after the examples stage is ``changed``).

``format_tree`` renders both as text.
"""

from __future__ import annotations

import configparser
import contextlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Iterator

import yaml

from pipeline.core.arithmetic import host_line, is_x86_64
from pipeline.core.errors import BertraceError
from pipeline.core.formats import MANIFEST
from pipeline.core.io import sha256_file
from pipeline.lineage.provenance import STAGE_ORDER, hash_path, iter_records, params_hash, record_digest
from pipeline.lineage.runlog import CHECKPOINT_RECORD_TAG, RECORD_TAG, read_run_log, with_run

OK, CHANGED, MISSING = "ok", "changed", "missing"
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
def _quiet_mlflow() -> Iterator[None]:
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

    from pipeline.lineage.tracking import tracking_uri

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
        with tempfile.TemporaryDirectory(prefix="bertrace-trace-") as tmp, _quiet_mlflow():
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


def _source(rec: dict[str, Any]) -> str | None:
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


def _imported(rec: dict[str, Any]) -> str:
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
        "source": _source(rec) if name == "download" else _imported(rec) if name == "imported" else None,
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
            with contextlib.suppress(Exception), _quiet_mlflow():
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
        from pipeline.lineage.tracking import check_server, tracking_uri

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
        for folder in path.resolve().parents:
            if (folder / "dvc.yaml").is_file() or (folder / ".dvc").is_dir():
                return folder
    return Path(".")


def lineage(target: str | os.PathLike, root: str | os.PathLike = ".") -> dict[str, Any]:
    """The stages behind ``target``, newest first.

    Returns ``{target, kind, target_sha256, chain: [node, ...], conflicts: [...], checks: [...]}``;
    each node is ``{stage, git_commit, git_dirty, dirty_paths, params_hash, params, started,
    finished, pipeline_run_id, mlflow_run_id, source, budget (pretrain: its budget record, with
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


# --------------------------------------------------------------------------------------------
# Verification


def dvc_cache_dir(root: str | os.PathLike) -> Path:
    """The DVC cache of the project at ``root``: ``cache.dir`` of .dvc/config(.local), else .dvc/cache."""
    dvc = Path(root) / ".dvc"
    cache = dvc / "cache"
    for name in ("config", "config.local"):
        parser = configparser.ConfigParser()
        with contextlib.suppress(configparser.Error, OSError):
            parser.read(dvc / name)
            if parser.has_option("cache", "dir"):
                cache = (dvc / parser.get("cache", "dir")).resolve()
    return cache


def _in_dvc_cache(cache: Path, md5: str) -> bool:
    """Whether the object ``md5`` (a file, or a ``.dir`` listing and every file in it) is cached."""

    def obj(h: str) -> Path | None:
        for base in (cache / "files" / "md5", cache):  # DVC 3, then DVC 2 layout
            p = base / h[:2] / h[2:]
            if p.is_file():
                return p
        return None

    p = obj(md5)
    if p is None:
        return False
    if md5.endswith(".dir"):
        try:
            entries = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return False
        return all(isinstance(e, dict) and obj(str(e.get("md5"))) is not None for e in entries)
    return True


def _stage_params(root: Path) -> dict[str, Any] | None:
    with contextlib.suppress(OSError, yaml.YAMLError):
        params = yaml.safe_load((root / "params.yaml").read_text(encoding="utf-8"))
        return params if isinstance(params, dict) else None
    return None


def _hash_artifact(check: dict[str, Any], root: Path) -> str | None:
    """sha256 of a file named by a check: a local path (relative to ``root``) or an MLflow artifact URI."""
    path = check["path"]
    if "mlflow_uri" not in check:
        p = Path(path) if Path(path).is_absolute() else root / path
        return sha256_file(p) if p.is_file() else None
    import mlflow.artifacts
    from mlflow.exceptions import MlflowException

    with tempfile.TemporaryDirectory(prefix="bertrace-trace-") as tmp, _quiet_mlflow():
        try:
            local = mlflow.artifacts.download_artifacts(
                artifact_uri=path, dst_path=tmp, tracking_uri=check["mlflow_uri"]
            )
        except (MlflowException, OSError):
            return None
        return sha256_file(local)


def verify(lin: dict[str, Any], root: str | os.PathLike = Path(".")) -> list[dict[str, Any]]:
    """Check every link of a lineage against what is present under ``root``.

    One entry per check: ``{stage, role, path, recorded, actual, status}``; ``role`` is
    ``input`` / ``output`` (file sha256), ``link`` (input vs the upstream stage's recorded
    output; ``upstream`` names it), ``params`` (params.yaml section hash; ``detail`` lists
    changed keys), ``dvc`` (dvc.lock md5 in the DVC cache), ``target`` or ``shard`` (a shard
    against the sha256 in its examples manifest, named by ``manifest``; only for a manifest that
    matches its record). ``status`` is ``ok``, ``changed`` or ``missing`` (``actual`` is ``None``:
    not present). Each file is hashed once.
    """
    root = Path(root)
    cache: dict[str, str | None] = {}
    results: list[dict[str, Any]] = []

    def add(stage, role, path, recorded, actual, **more):
        status = MISSING if actual is None else OK if actual == recorded else CHANGED
        results.append(
            {
                "stage": stage,
                "role": role,
                "path": path,
                "recorded": recorded,
                "actual": actual,
                "status": status,
                **more,
            }
        )

    for check in lin.get("checks") or []:
        add(
            lin["chain"][0]["stage"] if lin.get("chain") else "-",
            "target",
            check["path"],
            check["recorded"],
            _hash_artifact(check, root),
            what=check.get("what"),
        )

    chain = lin.get("chain", [])
    params_file = _stage_params(root)
    dvc_cache = dvc_cache_dir(root)
    for i, node in enumerate(chain):
        for role, paths in (("input", node.get("inputs") or {}), ("output", node.get("outputs") or {})):
            for path, recorded in paths.items():
                if path not in cache:
                    p = Path(path) if Path(path).is_absolute() else root / path
                    try:
                        cache[path] = hash_path(p) if p.exists() else None
                    except (FileNotFoundError, PermissionError):
                        cache[path] = None
                add(node["stage"], role, path, recorded, cache[path])
        for path, recorded in (node.get("inputs") or {}).items():  # cross-links to upstream outputs
            for up in chain[i + 1 :]:
                if path in (up.get("outputs") or {}):
                    add(node["stage"], "link", path, recorded, up["outputs"][path], upstream=up["stage"])
                    break
        section = (params_file or {}).get(node["stage"])
        recorded_params = node.get("params")
        if isinstance(section, dict) and isinstance(recorded_params, dict) and set(section) == set(recorded_params):
            detail = [
                f"{k}: {recorded_params[k]!r} -> {section[k]!r}"
                for k in sorted(section)
                if params_hash(section[k]) != params_hash(recorded_params[k])
            ]
            add(
                node["stage"],
                "params",
                f"params.yaml:{node['stage']}",
                node.get("params_hash"),
                params_hash(section),
                detail=detail,
            )
        for path, md5 in (node.get("dvc_outs") or {}).items():
            add(node["stage"], "dvc", path, md5, md5 if _in_dvc_cache(dvc_cache, md5) else None)
    for stage, manifest, shards in _recorded_shards(chain, root, cache):
        for path, recorded, actual in _hash_shards(root, shards):
            add(stage, "shard", path, recorded, actual, manifest=manifest)
    return results


def _recorded_shards(
    chain: list[dict[str, Any]], root: Path, hashes: dict[str, str | None]
) -> Iterator[tuple[str, str, list[tuple[str, str]]]]:
    """``(stage, manifest path, [(shard path, recorded sha256), ...])`` for each examples manifest
    named by the chain whose bytes here are the recorded ones: its per-shard sha256s are then
    part of the record too (a manifest that changed is reported as such, its shards are not read).
    The stage is the one that wrote the manifest (examples), else the first that read it."""
    named: dict[str, tuple[str, set[str]]] = {}
    for node in chain:
        for role in ("outputs", "inputs"):
            for path, recorded in (node.get(role) or {}).items():
                if Path(path).name != MANIFEST:
                    continue
                stage, seen = named.get(path, (node["stage"], set()))
                if role == "outputs":
                    stage = node["stage"]
                named[path] = (stage, seen | {recorded})
    for path, (stage, recorded) in named.items():
        if hashes.get(path) not in recorded:
            continue
        p = Path(path) if Path(path).is_absolute() else root / path
        try:
            manifest = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        splits = manifest.get("splits") if isinstance(manifest, dict) else None
        if not isinstance(splits, dict):
            continue  # not an examples manifest (no splits → shards)
        shards = [
            ((Path(path).parent / e["path"]).as_posix(), e["sha256"])
            for info in splits.values()
            if isinstance(info, dict) and isinstance(info.get("shards"), list)
            for e in info["shards"]
            if isinstance(e, dict) and isinstance(e.get("path"), str) and isinstance(e.get("sha256"), str)
        ]
        if shards:
            yield stage, path, shards


def _hash_shards(root: Path, shards: list[tuple[str, str]]) -> list[tuple[str, str, str | None]]:
    """``(path, recorded, actual)`` per shard, hashed in threads; a progress bar after 2 s on a terminal."""
    import hashlib
    from concurrent.futures import ThreadPoolExecutor

    from tqdm import tqdm

    files = [Path(p) if Path(p).is_absolute() else root / p for p, _ in shards]
    total = sum(f.stat().st_size for f in files if f.is_file())

    def digest(f: Path) -> str | None:
        if not f.is_file():
            return None
        h = hashlib.sha256()
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
                bar.update(len(block))
        return h.hexdigest()

    with (
        tqdm(total=total, unit="B", unit_scale=True, desc="verify shards", delay=2, leave=False, disable=None) as bar,
        ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool,
    ):
        actual = list(pool.map(digest, files))
    return [(p, recorded, now) for (p, recorded), now in zip(shards, actual)]


def summary(verification: list[dict[str, Any]]) -> dict[str, int]:
    counts = {OK: 0, CHANGED: 0, MISSING: 0}
    for v in verification:
        counts[v["status"]] = counts.get(v["status"], 0) + 1
    return counts


# --------------------------------------------------------------------------------------------
# Text rendering


def _short(h: str | None, n: int = 12) -> str:
    return h[:n] if h else "-"


_WORDS = {OK: "ok", CHANGED: "CHANGED", MISSING: "not present"}
_MAX_LISTED = 10  # shards not present, listed one per line before "... and N more"


def _shards_by_manifest(verification: list[dict[str, Any]], stage: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for v in verification:
        if v["role"] == "shard" and v["stage"] == stage:
            out.setdefault(v.get("manifest"), []).append(v)
    return out


_DVC_WORDS = {OK: "in DVC cache", MISSING: "not in DVC cache"}


def _mark(v: dict[str, Any] | None) -> str:
    if v is None:
        return ""
    if v["role"] == "dvc":
        return "  " + _DVC_WORDS[v["status"]]
    if v["status"] == CHANGED:
        return f"  CHANGED (now {_short(v['actual'])})"
    return "  " + _WORDS[v["status"]]


def format_tree(lin: dict[str, Any], verification: list[dict[str, Any]] | None = None) -> str:
    """A readable tree, newest stage first, with short hashes and (when verified) status marks."""
    by_key = {(v["stage"], v["role"], v["path"]): v for v in (verification or [])}
    lines = [f"{lin['target']}  ({lin['kind']}, sha256 {_short(lin.get('target_sha256'))})"]
    for check in lin.get("checks") or []:
        v = by_key.get((lin["chain"][0]["stage"] if lin.get("chain") else "-", "target", check["path"]))
        lines.append(f"   {check.get('what')}: {check['path']}  {_short(check['recorded'])}{_mark(v)}")
    chain = lin.get("chain", [])
    for depth, node in enumerate(chain):
        pad = "   " * depth
        known = node.get("run_known", True)
        commit = _short(node.get("git_commit")) if node.get("git_commit") else "no git" if known else "?"
        dirty = " (dirty)" if node.get("git_dirty") else ""
        params = f"params {_short(node.get('params_hash'))}"
        pv = by_key.get((node["stage"], "params", f"params.yaml:{node['stage']}"))
        if pv is not None and pv["status"] == CHANGED:
            params += f" (params.yaml now {_short(pv['actual'])})"
        if node["stage"] == "imported":  # a published checkpoint: no commit or params of ours
            lines.append(f"{pad}└─ imported")
        else:
            unknown = "" if known else "  (no run log of this record here: made in another copy, or restored by DVC)"
            lines.append(
                f"{pad}└─ {node['stage']}  commit {commit}{dirty}  {params}  finished {node.get('finished') or '?'}{unknown}"
            )
        body = pad + ("     " if depth == len(chain) - 1 else "   │ ")
        if node["stage"] == "pretrain" and (node.get("params") or {}).get("time_minutes"):
            lines.append(
                f"{body} wall-clock budget: not reproducible from its commit "
                f"(pretrain.time_minutes = {node['params']['time_minutes']}; set max_steps instead)"
            )
        for earlier in (node.get("budget") or {}).get("extends") or []:
            was = ", ".join(f"{k} {v}" for k, v in earlier.items() if k != "at_step")
            lines.append(
                f"{body} extends a run trained under {was} (resumed at update {earlier.get('at_step')}): "
                "not the weights these params give from scratch"
            )
        if node["stage"] == "pretrain" and (node.get("params") or {}).get("objective"):
            lines.append(f"{body} objective {node['params']['objective']}")  # mlm_nsp | mlm | electra ...
        if node.get("compute"):
            lines.append(f"{body} computed {compute_line(node['compute'])}")
        if node.get("git_dirty") and node.get("dirty_paths"):
            lines.append(f"{body} uncommitted: {', '.join(node['dirty_paths'])}")
        if node.get("experiment"):
            lines.append(f"{body} {experiment_line(node['experiment'])}")
        if node.get("source"):
            lines.append(f"{body} {'imported from' if node['stage'] == 'imported' else 'source'} {node['source']}")
        rows = [("in ", "input", p, h) for p, h in sorted(node.get("inputs", {}).items())]
        rows += [("out", "output", p, h) for p, h in sorted(node.get("outputs", {}).items())]
        rows += [("dvc", "dvc", p, h) for p, h in sorted((node.get("dvc_outs") or {}).items())]
        width = max((len(p) for _, _, p, _ in rows), default=0)
        for label, role, path, digest in rows:
            digest = _short(digest) if role != "dvc" else "md5 " + _short(digest)
            lines.append(
                f"{body} {label} {path:<{width}}  {digest}{_mark(by_key.get((node['stage'], role, path)))}".rstrip()
            )
        for manifest, shards in _shards_by_manifest(verification or [], node["stage"]).items():
            c = summary(shards)
            marks = [f"{c[OK]} ok"] + [f"{c[s]} {_WORDS[s]}" for s in (CHANGED, MISSING) if c[s]]
            lines.append(f"{body} {len(shards)} shards listed in {manifest}: {', '.join(marks)}")
    if lin.get("conflicts"):
        lines.append("conflicting copies of upstream records: " + ", ".join(lin["conflicts"]))
    if verification is not None:
        bad = [v for v in verification if v["status"] == CHANGED]
        for v in bad:
            what = {
                "link": f"input of {v['stage']} vs output of {v.get('upstream')}",
                "params": f"params of {v['stage']}",
                "target": v.get("what") or "target",
                "shard": f"shard listed in {v.get('manifest')}",
            }.get(v["role"], f"{v['role']} of {v['stage']}")
            lines.append(f"CHANGED {v['path']}  ({what})")
            lines.append(f"   recorded {v['recorded']}")
            lines.append(f"   {'upstream' if v['role'] == 'link' else 'now     '} {v['actual']}")
            for d in v.get("detail") or []:
                lines.append(f"   {d}")
        gone = [v for v in verification if v["role"] == "shard" and v["status"] == MISSING]
        for v in gone[:_MAX_LISTED]:
            lines.append(f"not present {v['path']}  (shard listed in {v.get('manifest')})")
        if len(gone) > _MAX_LISTED:
            lines.append(f"   ... and {len(gone) - _MAX_LISTED} more shards not present")
        c = summary(verification)
        lines.append(f"verify: {c[OK]} ok, {c[CHANGED]} changed, {c[MISSING]} not present")
    lines += reproduce_hint(lin)
    return "\n".join(lines)


def compute_line(c: dict[str, Any]) -> str:
    """``on cpu (x86_64 Linux), bf16 autocast, torch 2.13.0+cpu, 2 CPU threads``."""
    where = " ".join(str(c[k]) for k in ("machine", "system") if c.get(k))
    device = str(c.get("device") or "")
    parts = [f"on {device or 'a device not recorded'}" + (f" ({where})" if where else "")]
    precision = c.get("precision")
    parts.append(
        "precision not recorded" if not precision else "fp32" if precision == "fp32" else f"{precision} autocast"
    )
    parts.append(f"torch {c.get('torch') or '?'}")
    if c.get("num_threads") and device in ("", "cpu"):
        parts.append(f"{c['num_threads']} CPU thread{'s' if c['num_threads'] != 1 else ''}")
    if (c.get("world_size") or 1) > 1:
        parts.append(f"{c['world_size']} processes")
    arithmetic = c.get("arithmetic")
    if arithmetic and device in ("", "cpu"):
        parts.append(f"{arithmetic.get('kernels')} kernels ({arithmetic.get('cpu_capability')})")
    return ", ".join(parts)


def compute_differences(compute: dict[str, Any], params: dict[str, Any]) -> tuple[list[str], list[str]]:
    """``(differences, unknowns)``: what this machine would do differently from a recorded ``compute``
    (:func:`_compute`) when it reran the stage with the recorded ``params`` (their ``device``,
    ``precision`` and ``num_threads`` keys resolved here) — each difference means other bytes —
    and what the record leaves open. Both empty when device kind, precision, torch build and
    thread count match (the CPU's instruction set, not recorded, can still change fp32 sums)."""
    import torch  # only here: tracing a record needs no torch

    from pipeline.core.device import cpu_bf16_native, cpu_model, precision_name, resolve_device, resolve_precision

    diffs: list[str] = []
    unknown: list[str] = []
    recorded_type = str(compute.get("device") or "").split(":")[0] or None
    try:
        here = resolve_device(str(params.get("device") or "auto"))
    except BertraceError:
        here = None
    if recorded_type and (here is None or here.type != recorded_type):
        diffs.append(f"device {here.type if here is not None else 'none usable'} here, {recorded_type} when recorded")
    elif here is not None:
        asked = str(params.get("precision") or "auto")
        try:
            precision = precision_name(resolve_precision(asked, here)[0])
        except BertraceError:
            precision = "an error"
        if here.type == "cpu" and asked == "auto" and _portable(compute):
            precision = "fp32"  # what auto gives under the portable pins, which the stage sets
        no_bf16 = (
            " (this CPU has no bf16 instructions: AVX512-BF16, AMX or Arm BF16)"
            if here.type == "cpu" and not cpu_bf16_native()
            else ""
        )
        if not compute.get("precision"):
            unknown.append(
                f"precision {asked} gives {precision} here{no_bf16 if precision == 'fp32' else ''}; "
                "the record does not say what it gave (reports/pretrain.json does)"
            )
        elif precision != compute["precision"]:
            diffs.append(
                f"precision {asked} gives {precision} here{no_bf16 if asked == 'auto' else ''}, "
                f"{compute['precision']} when recorded"
            )
        elif precision == "bf16" and no_bf16:
            diffs.append(
                "bf16 is emulated on this CPU (no bf16 instructions): the same setting, far "
                "slower, and not promised to round as the recorded run's instructions did"
            )
        if here.type == "cpu" and compute.get("num_threads"):
            threads = int(params.get("num_threads") or 0) or torch.get_num_threads()
            if threads != compute["num_threads"]:
                diffs.append(
                    f"{threads} CPU threads here, {compute['num_threads']} when recorded "
                    f"(pretrain.num_threads: {compute['num_threads']} runs with as many)"
                )
    if compute.get("torch") and compute["torch"] != torch.__version__:
        diffs.append(f"torch {torch.__version__} here, {compute['torch']} when recorded")
    arithmetic = compute.get("arithmetic")
    if arithmetic is None:
        unknown.append("which CPU kernels it ran is not recorded here (a checkpoint's provenance records them)")
    elif arithmetic.get("host_specific") and arithmetic.get("cpu") != cpu_model():
        diffs.append(f"{host_line(arithmetic)}; this one is a {cpu_model()}")
    elif here is not None and here.type == "cpu" and not (is_x86_64() and torch.cpu.get_capabilities().get("avx2")):
        diffs.append("portable kernels need an x86-64 CPU with AVX2, which this one is not")
    return diffs, unknown


def _portable(compute: dict[str, Any]) -> bool:
    return bool(compute.get("arithmetic")) and not compute["arithmetic"].get("host_specific")


def this_machine(lin: dict[str, Any]) -> list[str]:
    """Whether rerunning pre-training on this machine would give the recorded weights, and if
    not why (`bertrace trace` prints these lines last; ``--json``: ``this_machine``)."""
    lines = []
    for node in lin.get("chain") or []:
        if not node.get("compute"):
            continue
        diffs, unknown = compute_differences(node["compute"], node.get("params") or {})
        if diffs:
            lines.append(f"this machine: `dvc repro` of {node['stage']} here gives other weights than recorded:")
        elif unknown:
            lines.append(f"this machine: {node['stage']} here matches the record as far as it goes:")
        else:
            lines.append(
                f"this machine: {node['stage']} here matches the record's device, precision, torch, "
                "CPU threads and "
                + (
                    "portable kernels: the same bytes"
                    if _portable(node["compute"])
                    else "kernels (the same bytes also need the same kind of CPU)"
                )
            )
        lines += [f"   {d}" for d in diffs] + [f"   cannot tell: {u}" for u in unknown]
    return lines


def experiment_line(exp: dict[str, Any]) -> str:
    """``DVC experiment <name> (baseline <rev>): a.b 1 -> 2, …`` for a record made by ``dvc exp run``."""
    diff = exp.get("params_diff") or {}
    changes = ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in list(diff.items())[:6])
    more = f", … ({len(diff)} params)" if len(diff) > 6 else ""
    return f"DVC experiment {exp.get('name')} (baseline {_short(exp.get('baseline_rev'), 10)})" + (
        f": {changes}{more}" if changes else ""
    )


def reproduce_hint(lin: dict[str, Any]) -> list[str]:
    """How to get this run's code and inputs back (docs/provenance.md "Reproduce a checkpoint")."""
    chain = lin.get("chain") or []
    if not chain or not chain[0].get("git_commit"):
        return []
    head = chain[0]
    exp = head.get("experiment")
    if exp and exp.get("name"):
        lines = [
            f"reproduce: dvc exp apply {exp['name']} && dvc repro   (the experiment's code and params; "
            f"or git checkout {exp.get('ref') or exp['name']})"
        ]
        if any(n.get("dvc_outs") for n in chain):
            lines.append(f"   inputs: dvc exp apply {exp['name']} && dvc checkout   (the experiment's dvc.lock)")
        return lines
    lines = [
        f"reproduce: git checkout {_short(head['git_commit'])} && dvc repro   (code and params of {head['stage']})"
        + ("; the tree was dirty: uncommitted changes are in no commit" if head.get("git_dirty") else "")
    ]
    md5 = next((m for n in chain for m in (n.get("dvc_outs") or {}).values()), None)
    if md5:
        lines.append(
            f"   inputs: git checkout $(git log --reverse --format=%h -S {md5} -- dvc.lock | head -1) && dvc checkout"
        )
    return lines
