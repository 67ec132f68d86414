"""The scorecard: this project's runs next to the stock Hugging Face route and published numbers.

One row per run: corpus, model, pre-training (minutes, device), the fine-tuning task's validation
accuracy (mean ± std over seeds), held-out test accuracy, the whole DAG's wall minutes and a hash
of every stage's params (so two rows with the same hash ran the same recipe). ``run_row`` builds
the row of the run in ``data/`` from the chain its fine-tuned checkpoint embeds and the stages'
reports; rows of other profiles (in-domain pre-training, the GPU profile, ...) are such rows
recorded earlier into ``reports/profiles/<name>.json`` (``bertrace scorecard record NAME``) and
shown beside it. :mod:`pipeline.reports.scorecard_md` makes the markdown; the evaluate stage writes its row
(``write_run_row``) and the ``scorecard`` stage draws the markdown (``write_scorecard``) beside
the anchors, published numbers and goals of ``reports/references.yaml``, so that editing a
reference number reruns a one-second stage, not evaluate.

This run's minutes, commit and date (:data:`TIMED_KEYS`) differ on every rebuild of the same
weights, so they stay out of the DVC outputs ``reports/scorecard.json`` and ``reports/scorecard.md``:
:func:`timed_row` reads them from the run logs (``runs/<stage>.json``, :mod:`pipeline.lineage.runlog`)
into the untracked ``runs/scorecard.md`` and into the rows ``bertrace scorecard record`` keeps.
:func:`dag_minutes` is the one sum of the DAG's minutes every place shows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Sequence

from pipeline.core.errors import BertraceError
from pipeline.core.io import sha256_json, write_json
from pipeline.lineage.provenance import STAGE_ORDER, iter_records, read_record
from pipeline.lineage.runlog import RUN_LOG_DIR, read_run_log

SCORECARD_JSON = Path("reports/scorecard.json")  # the evaluate stage's rows; `scorecard record` reads it
SCORECARD_MD = Path("reports/scorecard.md")  # the same rows as markdown, beside anchors and published numbers
RUNS_SCORECARD_MD = RUN_LOG_DIR / "scorecard.md"  # the same with this run's minutes, commit, date (untracked)
REFERENCES = Path("reports/references.yaml")  # anchors, published numbers, goals: not params (see the file)
PROFILES_DIR = Path("reports/profiles")  # recorded rows of other profiles
PIPELINE_STAGES = tuple(reversed(STAGE_ORDER[1:]))  # download … finetune: the stages before evaluate
ROW_KEYS = (
    "name",
    "corpus",
    "model",
    "pretrain_minutes",
    "device",
    "tokens_seen",
    "pretrain_budget",
    "task",
    "dev_mean",
    "dev_std",
    "seeds",
    "test",
    "imdb_test",
    "dag_minutes",
    "params_hash",
    "git_commit",
    "git_dirty",
    "date",
    "note",
    "warning",  # warning: evaluate's collapse check (pipeline.evaluate.report.collapse_warnings)
    "objective",  # pretrain.objective (mlm_nsp | mlm | electra ...); None without pre-training
    "val_metric",
    "val_loss",  # the objective's own best validation loss (val_mlm_loss, val_disc_loss ...)
    "variants",  # the finetune_variant@<name> stages' results: {name: {mode, settings, dev_mean, dev_std, ...}}
    "pretrain_sha",  # the pre-trained weights' model_sha256 (12 hex): joins a row to its checkpoint's IMDB row
    "pretrained",  # whether pre-trained weights are behind the row (recorded rows without it: pretrain_minutes)
    "pretrain_tokens_per_s",  # pre-training's throughput (run log timings.tokens_per_s)
)
# This run's measurements of time and place: from the run logs (timed_row), never in a DVC output.
TIMED_KEYS = ("pretrain_minutes", "pretrain_tokens_per_s", "dag_minutes", "git_commit", "git_dirty", "date")
DAG_STAGES = (*PIPELINE_STAGES, "evaluate")  # whose run logs' seconds make the DAG's minutes, with the variants
VARIANTS_DIR = Path("reports/variants")  # finetune_variant@<name>: reports/variants/<name>.json
CORRELATIONS = ("pearson", "spearman")  # selection metrics shown as they are; the others (accuracy, F1) in %


def selection_key(report: dict[str, Any]) -> str | None:
    """``validation_<metric>`` of the metric that picked the best seed: every task type's report
    names it as ``best_validation_<metric>`` (pipeline/finetune/tasks/base.py); None without one."""
    return next(
        (
            k.removeprefix("best_")
            for k in report
            if k.startswith("best_validation_") and isinstance(report.get(k.removeprefix("best_")), dict)
        ),
        None,
    )


def read_variants(
    directory: str | Path = VARIANTS_DIR, names: Iterable[str] | None = None
) -> dict[str, dict[str, Any]]:
    """``{name: {mode, settings, dev_mean, dev_std, seeds}}`` from the ``finetune_variant`` stages'
    ``reports/variants/<name>.json`` (dev in %, as the scorecard's rows; their minutes: :func:`timed_row`);
    {} without any.
    ``names``: the variants params.yaml declares now; a file of a variant removed since (DVC leaves a
    removed stage's outputs in place) is skipped."""
    out: dict[str, dict[str, Any]] = {}
    keep = None if names is None else set(names)
    for path in sorted(Path(directory).glob("*.json")):
        if keep is not None and path.stem not in keep:
            continue
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise BertraceError(f"{path}: unreadable ({e}); rerun `dvc repro finetune_variant@{path.stem}`") from None
        key = selection_key(d)
        if key is None:
            raise BertraceError(
                f"{path}: no best_validation_<metric> with its validation_<metric> mean; "
                f"rerun `dvc repro finetune_variant@{path.stem}`"
            )
        scale = 1 if key.removeprefix("validation_") in CORRELATIONS else 100
        overrides = d.get("overrides") or {}
        out[str(d.get("variant") or path.stem)] = {
            "mode": d.get("mode"),
            "settings": ", ".join(f"{k}: {v}" for k, v in overrides.items()) or "as finetune",
            "dev_mean": round(d[key]["mean"] * scale, 2 if scale == 100 else 4),
            "dev_std": round(d[key]["std"] * scale, 2 if scale == 100 else 4),
            "seeds": d.get("n_seeds"),
        }
    return out


def chain_records(provenance: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """``{stage: record}`` of the chain a fine-tuned checkpoint embeds (its ``provenance``; each stage's
    most downstream record): what :func:`run_row` reads, a function of the checkpoint's bytes."""
    records: dict[str, dict[str, Any]] = {}
    for stage, record in iter_records(provenance or {}, "finetune"):
        records.setdefault(stage, record)
    return records


def _corpus(download_params: dict[str, Any]) -> str:
    if download_params.get("source") == "local":
        return f"local: {(download_params.get('local') or {}).get('path')}"
    hub = download_params.get("hub") or {}
    splits = list(hub.get("splits") or [])
    some = f" ({'+'.join(splits)})" if splits and splits != ["train", "validation", "test"] else ""
    return f"hub: {hub.get('dataset')}/{hub.get('config')}{some}"


def _model(model_config: dict[str, Any] | None) -> str:
    if not model_config:
        return "—"
    return f"{model_config.get('num_layers')}L/{model_config.get('hidden_size')}"


def _budget(pretrain_metrics: dict[str, Any]) -> str | None:
    """``max_steps=6000`` etc.; ``time_minutes=40`` is wall clock: its weights are not reproducible."""
    b = pretrain_metrics.get("budget")
    return f"{b['kind']}={b['value']}" if isinstance(b, dict) and b.get("kind") else None


def run_row(
    name: str,
    *,
    records: dict[str, dict[str, Any]],
    finetune_metrics: dict[str, Any],
    eval_metrics: dict[str, Any],
    pretrain_metrics: dict[str, Any] | None = None,
    model_config: dict[str, Any] | None = None,
    task: str | None = None,
    warnings: Sequence[str] = (),
) -> dict[str, Any]:
    """The scorecard row of one pipeline run, without its minutes, commit and date (:func:`timed_row`).

    ``records``: provenance records by stage, the chain the fine-tuned checkpoint embeds
    (:func:`chain_records`); ``finetune_metrics`` / ``eval_metrics`` / ``pretrain_metrics``: all the
    stages' numbers (reports/<stage>.json); ``warnings``: :func:`pipeline.evaluate.report.collapse_warnings`
    (the row is marked ⚠).
    """
    finetune = records.get("finetune")
    if finetune is None:
        raise BertraceError("data/finetune/model.pt: its provenance has no finetune record; rerun `dvc repro finetune`")
    # a published encoder (pipeline/interop/hf_import.py): no corpus or pre-training of ours behind the row
    imported = records.get("imported") or (finetune.get("upstream") or {}).get("imported")
    mode = (finetune.get("params") or {}).get("mode", "full")
    if not imported and mode != "scratch" and "download" not in records:
        raise BertraceError(
            "data/finetune/model.pt: its provenance has no download record (fine-tuned from a checkpoint that "
            "does not embed its chain); run the whole pipeline (dvc repro) before making the scorecard"
        )
    acc = finetune_metrics.get("validation_accuracy") or {}
    if not isinstance(acc, dict) or "mean" not in acc:
        raise BertraceError("reports/finetune.json: no validation_accuracy mean; rerun dvc repro finetune")
    pretrain_metrics = {} if imported else pretrain_metrics or {}
    pretrained = bool(pretrain_metrics) and mode != "scratch"
    objective = ((records.get("pretrain") or {}).get("params") or {}).get("objective") if pretrained else None
    val_metric = _own_val_metric(pretrain_metrics) if objective else None
    if imported:
        corpus = f"published: {imported.get('source')}@{str(imported.get('resolved_revision') or 'local')[:10]}"
    else:
        corpus = _corpus(records["download"].get("params") or {}) if "download" in records else None
    return {
        "name": name,
        "corpus": corpus,
        "model": _model(model_config) + ("" if mode == "full" else f" ({mode})"),
        "pretrained": pretrained,
        "device": pretrain_metrics.get("device", "—"),
        "tokens_seen": pretrain_metrics.get("tokens_seen"),
        "pretrain_budget": _budget(pretrain_metrics) if pretrained else None,
        "task": task,
        "dev_mean": round(100 * float(acc["mean"]), 2),
        "dev_std": round(100 * float(acc.get("std", 0.0)), 2),
        "seeds": int(finetune_metrics.get("n_seeds") or len(finetune_metrics.get("per_seed") or {}) or 1),
        "test": round(100 * float(eval_metrics["test"]["accuracy"]), 2) if "test" in eval_metrics else None,
        "imdb_test": None,
        "params_hash": sha256_json({s: records[s].get("params_hash") for s in PIPELINE_STAGES if s in records})[:12],
        "note": "",
        "warning": "; ".join(warnings) or None,
        "objective": objective,
        "val_metric": val_metric,
        "val_loss": (
            round(float(pretrain_metrics[f"best_{val_metric}"]), 4)
            if val_metric and pretrain_metrics.get(f"best_{val_metric}") is not None
            else None
        ),
        "pretrain_sha": (
            str(pretrain_metrics["model_sha256"])[:12] if objective and pretrain_metrics.get("model_sha256") else None
        ),
    }


# --------------------------------------------------------------------------------------------
# This run's minutes, commit and date: the run logs


def dag_run_stages(variants: Iterable[str] = ()) -> list[str]:
    """The stages whose run logs make the DAG's minutes: download … finetune, the variants, evaluate
    (``scorecard`` and ``plots`` draw reports from the others' outputs, in seconds)."""
    stages = list(DAG_STAGES)
    return [*stages[:-1], *(f"finetune_variant@{v}" for v in variants), stages[-1]]


def run_logs(variants: Iterable[str] = (), root: str | Path = ".") -> dict[str, dict[str, Any] | None]:
    """``{stage: run log}`` of :func:`dag_run_stages` under ``root``: ``runs/<stage>.json`` when it
    belongs to the stage's record in ``data/provenance/`` (any, for a stage without a record there),
    None where there is none or it belongs to another run's outputs."""
    logs: dict[str, dict[str, Any] | None] = {}
    for stage in dag_run_stages(variants):
        try:
            record = read_record(stage, root)
        except BertraceError:  # an unreadable record: no run log can be matched to it
            logs[stage] = None
            continue
        logs[stage] = read_run_log(stage, record, root)
    return logs


def _seconds(log: dict[str, Any] | None) -> float | None:
    value = (log or {}).get("seconds")
    return float(value) if isinstance(value, (int, float)) else None


def dag_minutes(logs: dict[str, dict[str, Any] | None]) -> float | None:
    """The DAG's wall minutes: the sum of every stage's ``seconds`` in ``logs`` (:func:`run_logs`, the
    variants included), None without any. The one sum that every scorecard and profile row shows."""
    seconds = [s for s in map(_seconds, logs.values()) if s is not None]
    return round(sum(seconds) / 60.0, 1) if seconds else None


def timed_row(row: dict[str, Any], logs: dict[str, dict[str, Any] | None]) -> dict[str, Any]:
    """``row`` with this run's :data:`TIMED_KEYS` from its run logs (``logs``: :func:`run_logs`):
    pre-training's training minutes and tokens/s (``runs/pretrain.json`` ``timings.train_seconds``,
    ``timings.tokens_per_s``), :func:`dag_minutes`, fine-tuning's commit and day, each variant's
    minutes; None where a run log is missing. For ``runs/scorecard.md`` and ``scorecard record``."""
    timings = (logs.get("pretrain") or {}).get("timings") or {}
    pretrained = is_pretrained(row)
    train_seconds, tokens_per_s = timings.get("train_seconds"), timings.get("tokens_per_s")
    finetune = logs.get("finetune") or {}
    git = finetune.get("git") or {}
    out = {
        **row,
        "pretrain_minutes": (
            round(train_seconds / 60.0, 2) if pretrained and isinstance(train_seconds, (int, float)) else None
        ),
        "pretrain_tokens_per_s": (
            round(float(tokens_per_s), 1) if pretrained and isinstance(tokens_per_s, (int, float)) else None
        ),
        "dag_minutes": dag_minutes(logs),
        "git_commit": (git.get("commit") or "")[:10] or None,
        "git_dirty": git.get("dirty"),
        "date": str(finetune.get("finished") or "")[:10] or None,
    }
    if row.get("variants"):
        out["variants"] = {
            name: {**v, "minutes": _minutes(_seconds(logs.get(f"finetune_variant@{name}")))}
            for name, v in row["variants"].items()
        }
    return out


def stage_minutes(log: dict[str, Any] | None) -> float | None:
    """A stage's minutes from its run log (None without one)."""
    return _minutes(_seconds(log))


def _minutes(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds / 60.0, 1)


def untimed_row(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` without this run's :data:`TIMED_KEYS` and its variants' minutes: what a DVC output shows."""
    out = {k: v for k, v in row.items() if k not in TIMED_KEYS}
    if row.get("variants"):
        out["variants"] = {n: {k: x for k, x in v.items() if k != "minutes"} for n, v in row["variants"].items()}
    return out


def _own_val_metric(pretrain_metrics: dict[str, Any]) -> str | None:
    """The validation loss the run's objective selects best.pt by: the pre-training summary's one
    ``best_<metric>`` key (``Objective.best_metric``: val_mlm_loss, val_disc_loss, val_loss)."""
    names = [k[len("best_") :] for k in pretrain_metrics if k.startswith("best_val_")]
    return names[0] if len(names) == 1 else None


def task_name(source: dict[str, Any] | None) -> str | None:
    """The task a fine-tuned checkpoint was trained on, as rows and goals name it: ``dataset/config``
    for a hub task (``nyu-mll/glue/sst2``, also through a mirror), ``local: <train file>`` for local
    files; None when unknown."""
    source = source or {}
    if source.get("type") == "local":
        files = source.get("files") or {}
        first = files.get("train") or next(iter(files.values()), None)
        return f"local: {first}" if first else "local"
    return "/".join(str(x) for x in (source.get("dataset"), source.get("config")) if x) or None


def read_profiles(directory: str | Path) -> list[dict[str, Any]]:
    """Rows recorded in ``directory/*.json``, sorted by name; a clear error for a broken file."""
    rows = []
    directory = Path(directory)
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            row = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BertraceError(
                f"{path}: not valid JSON ({e}); fix it or record it again with `bertrace scorecard record NAME`"
            ) from None
        if not isinstance(row, dict) or "dev_mean" not in row:
            raise BertraceError(
                f"{path}: not a scorecard row (no dev_mean); record it with `bertrace scorecard record`"
            )
        rows.append({**{k: None for k in ROW_KEYS}, **row, "name": row.get("name") or path.stem})
    return rows


def is_pretrained(row: dict[str, Any]) -> bool:
    """Whether pre-trained weights are behind ``row`` (its ``pretrained``; a row recorded without it: its
    pre-training minutes)."""
    if row.get("pretrained") is not None:
        return bool(row["pretrained"])
    return row.get("pretrain_minutes") is not None


def read_references(path: str | Path = REFERENCES) -> dict[str, Any]:
    """``{goal, anchors, baselines, learning_curve}`` from ``path`` ({} for a missing file)."""
    import yaml

    path = Path(path)
    if not path.exists():
        return {}
    try:
        refs = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise BertraceError(f"{path}: not valid YAML ({e}); fix or restore it from the repository") from None
    if not isinstance(refs, dict):
        raise BertraceError(f"{path}: expected a mapping with goal / anchors / baselines / learning_curve")
    baselines = refs.get("baselines") or {}
    if not isinstance(baselines, dict) or not all(isinstance(v, (int, float)) for v in baselines.values()):
        raise BertraceError(
            f"{path}: baselines must map a model name to its published accuracy in %, "
            'e.g. {"BERT-base (Devlin et al. 2019, GLUE test)": 93.5}'
        )
    return refs


def with_variants(row: dict[str, Any], variants: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``row`` with its run's finetune_variant results (:func:`read_variants`); their minutes count in
    the DAG's (:func:`dag_minutes`, from the run logs)."""
    return {**row, "variants": variants}


def write_run_row(row: dict[str, Any] | None, json_path: str | Path = SCORECARD_JSON) -> None:
    """The evaluated run's own row (``{"this_run": row}``, without :data:`TIMED_KEYS`), read by
    ``write_scorecard``."""
    write_json(json_path, {"this_run": None if row is None else untimed_row(row)})
