"""The scorecard: this project's runs next to the stock Hugging Face route and published numbers.

One row per run: corpus, model, pre-training (minutes, device), the fine-tuning task's validation
accuracy (mean ± std over seeds), held-out test accuracy, the whole DAG's wall minutes and a hash
of every stage's params (so two rows with the same hash ran the same recipe). ``run_row`` builds
the row of the run in ``data/`` from the chain its fine-tuned checkpoint embeds and the stages'
reports; rows of other profiles (in-domain pre-training, the GPU profile, ...) are such rows
recorded earlier into ``reports/profiles/<name>.json`` (``bertrace scorecard record NAME``) and
shown beside it. ``render_scorecard`` makes the markdown; the evaluate stage writes its row
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
from pipeline.core.io import atomic_open, sha256_json, write_json
from pipeline.finetune.task_metrics import SELECTION
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
_SELECTION_KEYS = tuple(f"validation_{m}" for m in SELECTION.values())  # reports/<stage>.json, per task type


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
        key = next((k for k in _SELECTION_KEYS if isinstance(d.get(k), dict)), None)
        if key is None:
            raise BertraceError(
                f"{path}: no {' / '.join(_SELECTION_KEYS)} mean; rerun `dvc repro finetune_variant@{path.stem}`"
            )
        scale = 1 if key == f"validation_{SELECTION['regression']}" else 100  # a correlation, not a %
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


def _minutes(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds / 60.0, 1)


def untimed_row(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` without this run's :data:`TIMED_KEYS` and its variants' minutes: what a DVC output shows."""
    out = {k: v for k, v in row.items() if k not in TIMED_KEYS}
    if row.get("variants"):
        out["variants"] = {n: {k: x for k, x in v.items() if k != "minutes"} for n, v in row["variants"].items()}
    return out


def run_stage_lines(logs: dict[str, dict[str, Any] | None]) -> list[str]:
    """Markdown: this run's stages with their minutes, finish time and commit (``logs``: :func:`run_logs`),
    "—" where a run log is missing, and the DAG's total (:func:`dag_minutes`)."""
    lines = [
        "## This run's stages (run logs: `runs/<stage>.json`)",
        "",
        "| stage | minutes | finished (UTC) | commit |",
        "|---|---:|---|---|",
    ]
    for stage, log in logs.items():
        git = (log or {}).get("git") or {}
        commit = _fmt((git.get("commit") or "")[:10] or None) + (" (dirty)" if git.get("dirty") else "")
        lines.append(
            f"| {stage} | {_fmt(_minutes(_seconds(log)), '.1f')} | {_fmt((log or {}).get('finished'))} | "
            f"{commit if log else '—'} |"
        )
    lines.append(f"| **DAG** | **{_fmt(dag_minutes(logs), '.1f')}** | | |")
    missing = [s for s, log in logs.items() if log is None]
    if missing:
        lines += [
            "",
            f"No run log of this run's outputs for {', '.join(missing)} (not run in this working copy, or "
            "`runs/<stage>.json` belongs to other outputs): not counted.",
        ]
    return lines + [""]


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


def _fmt(value: Any, spec: str = "") -> str:
    if value is None or value == "":
        return "—"
    return format(value, spec) if spec else str(value)


def variant_of_mode(row: dict[str, Any], mode: str) -> dict[str, Any] | None:
    """The row's first fine-tuning variant run in ``mode`` (``frozen`` / ``scratch``), whatever its name."""
    return next((v for v in (row.get("variants") or {}).values() if v.get("mode") == mode), None)


def goal_seeds(goal: dict[str, Any]) -> int:
    """Fine-tuning seeds a row's mean needs to count for the goal (references.yaml ``goal.seeds``, else 3)."""
    return int(goal.get("seeds") or 3)


def gain_over_scratch(row: dict[str, Any]) -> float | None:
    """Dev accuracy minus the row's ``scratch``-mode variant (the same model from random weights), or None."""
    scratch = variant_of_mode(row, "scratch")
    return None if scratch is None or scratch.get("dev_mean") is None else row["dev_mean"] - scratch["dev_mean"]


def is_pretrained(row: dict[str, Any]) -> bool:
    """Whether pre-trained weights are behind ``row`` (its ``pretrained``; a row recorded without it: its
    pre-training minutes)."""
    if row.get("pretrained") is not None:
        return bool(row["pretrained"])
    return row.get("pretrain_minutes") is not None


def _pretraining(r: dict[str, Any]) -> str:
    """The "pre-training" cell: objective, minutes (else the budget), device, tokens/s."""
    if not is_pretrained(r):
        return "none"
    size = f"{r['pretrain_minutes']:.1f} min" if r.get("pretrain_minutes") is not None else r.get("pretrain_budget")
    cell = " ".join(str(x) for x in (size, r.get("device")) if x) or "pre-trained"
    if r.get("objective"):
        cell = f"{r['objective']}, {cell}"
    if r.get("pretrain_tokens_per_s") is not None:
        cell += f", {r['pretrain_tokens_per_s']:,.0f} tok/s"
    if str(r.get("pretrain_budget") or "").startswith("time_minutes"):
        cell += " (wall-clock budget: not reproducible)"
    return cell


def render_scorecard(
    rows: Sequence[dict[str, Any]],
    *,
    anchors: Iterable[dict[str, Any]] = (),
    baselines: dict[str, float] | None = None,
    goal: dict[str, float] | None = None,
    task: str | None = None,
    untimed: Iterable[str] = (),
    preamble: Sequence[str] = (),
    current: str | None = None,
) -> str:
    """The scorecard as markdown: the run ``current`` names (its row, notes, the goal, its
    fine-tuning variants), the anchors and published numbers, then the past experiments (the other
    rows, their variants, the objective × corpus table). Without ``current`` every row is a past one.

    ``untimed``: names of rows whose minutes, commit and date are not shown here (this run's, in a DVC
    output: they are in ``runs/scorecard.md``); the goal's time bar is then left open for them.
    ``preamble``: markdown lines after the title."""
    task = task or "the task"
    rows = with_imdb_test(rows)
    untimed = set(untimed)
    this = [r for r in rows if r["name"] == current]
    past = [r for r in rows if r["name"] != current]
    lines = [
        "# Scorecard",
        "",
        *preamble,
        f"Validation accuracy on {task} (mean ± std over fine-tuning seeds), drawn by the `scorecard` stage "
        "from the `evaluate` stage's row, rows of other profiles (`reports/profiles/*.json`) and "
        "`reports/references.yaml`.",
        "",
    ]
    if goal:
        lines += [_goal_line(goal), ""]
    if this:
        lines += ["## This run", "", *_run_table(this, task, untimed)]
        lines += _goal_verdict(rows, goal, untimed) if goal else []
        lines += _variants_table(this, "## Fine-tuning variants")
    lines += _references(list(anchors), baselines)
    if past:
        lines += ["", "## Past experiments (`reports/profiles/*.json`)", ""] if this else ["## This project", ""]
        lines += _run_table(past, task, untimed)
        lines += _goal_verdict(rows, goal, untimed) if goal and not this else []
        lines += _variants_table(past, "### Their fine-tuning variants" if this else "## Fine-tuning variants")
    lines += objective_corpus_table(rows, task)
    return "\n".join(lines).rstrip() + "\n"


def _goal_line(goal: dict[str, Any]) -> str:
    gain = goal.get("gain_over_scratch")
    return (
        f"Goal: ≥ {goal['dev_mean']:.1f} % mean of {goal_seeds(goal)} seeds with the whole DAG in ≤ "
        f"{goal['dag_minutes']:.0f} minutes on 2 CPU cores"
        + (
            f", and ≥ +{gain:.1f} points over the same model from random weights (its `scratch` variant, as many seeds)"
            if gain is not None
            else ""
        )
        + "."
    )


def _run_table(rows: Sequence[dict[str, Any]], task: str, untimed: set[str]) -> list[str]:
    """The rows' table and their notes."""
    lines = [
        "| run | corpus | model | pre-training | dev acc. (%) | test acc. (%) | IMDB test (%) | DAG wall | "
        "params hash | commit |",
        "|---|---|---|---|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        pre = _pretraining(r)
        dev = f"**{r['dev_mean']:.2f}** ± {r['dev_std']:.2f} ({r['seeds']} seed{'s' if r['seeds'] != 1 else ''})"
        if r.get("warning"):
            dev = "⚠ " + dev  # predictions collapsed / at the majority baseline: see the note below
        if r.get("task") != task and task != "the task":
            dev += f" on {r.get('task') or 'another task'}"  # a recorded row of another task
        commit = _fmt(r.get("git_commit")) + (" (dirty)" if r.get("git_dirty") else "")
        dag = _fmt(r.get("dag_minutes"), ".1f") + (" min" if r.get("dag_minutes") is not None else "")
        lines.append(
            f"| {r['name']} | {_fmt(r.get('corpus'))} | {_fmt(r.get('model'))} | {pre} | {dev} | "
            f"{_fmt(r.get('test'), '.2f')} | {_fmt(r.get('imdb_test'), '.2f')} | "
            f"{dag} | `{_fmt(r.get('params_hash'))}` | {commit} |"
        )
    notes = [f"- **{r['name']}**: {r['note']}" for r in rows if r.get("note")]
    notes += [f"- ⚠ **{r['name']}**: {r['warning']}" for r in rows if r.get("warning")]
    notes += [
        f"- **{r['name']}**: minutes, commit and date in `{RUNS_SCORECARD_MD}` (`bertrace scorecard show`), "
        "read from the run logs: they differ on every rebuild of the same weights"
        for r in rows
        if r["name"] in untimed
    ]
    return lines + ([""] + notes if notes else [])


def _goal_verdict(rows: Sequence[dict[str, Any]], goal: dict[str, Any], untimed: set[str]) -> list[str]:
    """Which rows (of the goal's task) meet the goal: accuracy, seeds, time, gain over scratch."""
    same_task = [r for r in rows if not goal.get("task") or r.get("task") == goal["task"]]
    fast = [
        r
        for r in same_task
        if r["dev_mean"] >= goal["dev_mean"]
        and r.get("seeds", 0) >= goal_seeds(goal)
        and (r["name"] in untimed or (r.get("dag_minutes") or 1e9) <= goal["dag_minutes"])
    ]
    gain = goal.get("gain_over_scratch")
    gains = {r["name"]: gain_over_scratch(r) for r in fast}
    met = [r for r in fast if gain is None or (gains[r["name"]] is not None and gains[r["name"]] >= gain - 1e-9)]
    timed = [r["name"] for r in met if r["name"] not in untimed]
    lines = ["", f"Goal met by: {', '.join(timed) if timed else 'none of these rows'}."]
    if open_time := [r["name"] for r in met if r["name"] in untimed]:
        lines += [
            "",
            f"Accuracy{'' if gain is None else ' and gain'} met by {', '.join(open_time)}; its DAG minutes, "
            f"the time bar, are in `{RUNS_SCORECARD_MD}`.",
        ]
    short = [f"{r['name']} ({_fmt(gains[r['name']], '+.2f')})" for r in fast if r not in met]
    if short:
        met_what = "Accuracy and time" if not untimed else "Accuracy (and time, where shown)"
        lines += ["", f"{met_what} met, but not +{gain:.1f} over random weights: {', '.join(short)}."]
    return lines


def _variants_table(rows: Sequence[dict[str, Any]], heading: str) -> list[str]:
    """The ``finetune_variant@<name>`` results of the rows that have them, each against its full row."""
    with_variants = [r for r in rows if r.get("variants")]
    if not with_variants:
        return []
    lines = [
        "",
        heading,
        "",
        "The `finetune_variant@<name>` stages (params.yaml `finetune_variants`): the run's checkpoint, task "
        "and seeds fine-tuned again with other settings. `frozen`: a linear probe on the frozen encoder "
        "(what its features alone carry); `scratch`: the same model from random weights (what "
        "pre-training adds). Δ: against the run's own `finetune` (full) row.",
        "",
        "| run | variant | settings | dev (mean ± std) | Δ vs full | wall min |",
        "|---|---|---|---:|---:|---:|",
    ]
    for r in with_variants:
        lines.append(
            f"| {r['name']} | full (`finetune`) | mode: full | {r['dev_mean']:.2f} ± {r['dev_std']:.2f} | — | — |"
        )
        for name, v in r["variants"].items():
            delta = v["dev_mean"] - r["dev_mean"]
            lines.append(
                f"| {r['name']} | {name} | {v.get('settings') or '—'} | {v['dev_mean']:.2f} ± "
                f"{v['dev_std']:.2f} | {delta:+.2f} | {_fmt(v.get('minutes'), '.1f')} |"
            )
    return lines


def _references(anchors: list[dict[str, Any]], baselines: dict[str, float] | None) -> list[str]:
    """The stock Hugging Face route's anchors and the published numbers."""
    lines: list[str] = []
    if anchors:
        lines += [
            "",
            "## Anchors: the stock Hugging Face route, measured on the same machine kind (2 CPU cores)",
            "",
            "| route | model | pre-training | dev acc. (%) |",
            "|---|---|---|---:|",
        ]
        for a in anchors:
            lines.append(
                f"| {a.get('name')} | {_fmt(a.get('model'))} | {_fmt(a.get('pretrain'))} | {_fmt(a.get('dev'))} |"
            )
    if baselines:
        lines += [
            "",
            "## Published (GLUE test server; other corpora, sizes and compute: a reference, not like-for-like)",
            "",
            "| model | acc. (%) |",
            "|---|---:|",
        ]
        lines += [f"| {name} | {float(v):.1f} |" for name, v in baselines.items()]
    return lines


GRID_OBJECTIVES = ("mlm_nsp", "mlm", "electra")  # the objective x corpus grid; other objectives join it


def objective_corpus_table(rows: Sequence[dict[str, Any]], task: str | None) -> list[str]:
    """Markdown lines: every pre-trained row of ``task`` by corpus and objective, with the objective's own
    validation loss, dev, the frozen probe, the gain over the same model from random weights (the
    ``scratch`` variant), IMDB test and minutes; a grid objective a corpus has no row for says so."""
    pre = [r for r in rows if r.get("objective") and is_pretrained(r) and (task is None or r.get("task") == task)]
    if not pre:
        return []
    lines = [
        "",
        "## Pre-training objective × corpus",
        "",
        "Every pre-trained row above on this task, by corpus. Val. loss: the objective's own best validation "
        "loss (MLM cross-entropy for mlm_nsp / mlm, the discriminator's replaced-token loss for electra, "
        "next-token loss for clm: not comparable across objectives). Frozen: the `frozen` variant (linear "
        "probe). Δ scratch: dev minus the `scratch` variant (the same model and recipe from random weights). "
        "IMDB test: the same pre-trained weights fine-tuned on IMDB (`make repro PROFILE=imdb`, a recorded row "
        "with the same `pretrain_sha`; 1 seed). "
        "Minutes: pre-training's own (train_seconds), and the whole DAG's.",
        "",
        "| corpus | objective | run | val. loss | dev (mean ± std) | frozen | Δ scratch | IMDB test | "
        "pre-train min | DAG min |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    corpora = list(dict.fromkeys(r.get("corpus") for r in pre))
    for corpus in corpora:
        here = [r for r in pre if r.get("corpus") == corpus]
        objectives = list(GRID_OBJECTIVES) + [
            o for o in dict.fromkeys(r["objective"] for r in here) if o not in GRID_OBJECTIVES
        ]
        for objective in objectives:
            runs = [r for r in here if r["objective"] == objective]
            if not runs:
                lines.append(f"| {_fmt(corpus)} | {objective} | not run yet | — | — | — | — | — | — | — |")
            for r in runs:
                frozen = variant_of_mode(r, "frozen")
                val = f"{r['val_metric']} {r['val_loss']:.3f}" if r.get("val_loss") is not None else "—"
                seeds = int(r.get("seeds") or 1)
                dev = f"{r['dev_mean']:.2f} ± {r['dev_std']:.2f}" + (
                    "" if seeds >= 3 else f" ({seeds} seed{'s' if seeds > 1 else ''})"
                )
                lines.append(
                    f"| {_fmt(corpus)} | {objective} | {r['name']} | {val} | {dev} "
                    f"| {_fmt(frozen and frozen['dev_mean'], '.2f')} "
                    f"| {_fmt(gain_over_scratch(r), '+.2f')} "
                    f"| {_fmt(r.get('imdb_test'), '.2f')} | {_fmt(r.get('pretrain_minutes'), '.1f')} "
                    f"| {_fmt(r.get('dag_minutes'), '.1f')} |"
                )
    return lines


def is_imdb_task(task: str | None) -> bool:
    """An IMDB fine-tuning row's task: the hub's ``stanfordnlp/imdb/...`` or local IMDB files."""
    return "imdb" in str(task or "").lower()


def with_imdb_test(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` with ``imdb_test`` filled where it is unset: an IMDB row's own test accuracy, and for
    any other row the test accuracy of an IMDB row with the same ``pretrain_sha`` (the same
    pre-trained weights fine-tuned with ``make repro PROFILE=imdb`` and recorded with ``bertrace
    scorecard record``). A value set with ``--set imdb_test=...`` is kept."""
    by_checkpoint = {
        r["pretrain_sha"]: r["test"]
        for r in rows
        if is_imdb_task(r.get("task")) and r.get("pretrain_sha") and r.get("test") is not None
    }
    out = []
    for r in rows:
        if r.get("imdb_test") is None:
            own = r.get("test") if is_imdb_task(r.get("task")) else by_checkpoint.get(r.get("pretrain_sha") or "")
            r = {**r, "imdb_test": own}
        out.append(r)
    return out


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


def write_scorecard(
    row: dict[str, Any] | None,
    *,
    references: dict[str, Any],
    task: str | None = None,
    profiles_dir: str | Path = PROFILES_DIR,
    md_path: str | Path = SCORECARD_MD,
    variants: dict[str, dict[str, Any]] | None = None,
    logs: dict[str, dict[str, Any] | None] | None = None,
    runs_md_path: str | Path = RUNS_SCORECARD_MD,
) -> list[dict[str, Any]]:
    """Write ``md_path`` from ``row`` (the run in ``data/``, or None), the rows recorded in
    ``profiles_dir`` (a recorded row named like ``row`` is that run's older copy and is left out) and
    ``references`` (:func:`read_references`; the goal, the anchors and the published numbers are
    shown only when ``task`` is theirs: the goal's ``task``, or references.yaml's top-level ``task``,
    and "Goal met by" counts only rows of that task). ``row`` is shown without its minutes, commit and
    date, so ``md_path`` is the same for every rebuild of the same weights. With ``logs``
    (:func:`run_logs`), also ``runs_md_path``: the same scorecard with them (:func:`timed_row`) and this
    run's stages. Returns the rows shown."""
    if row is not None and variants:
        row = with_variants(row, variants)
    if row is not None:
        row = untimed_row(row)
    profiles = [r for r in read_profiles(profiles_dir) if row is None or r["name"] != row["name"]]
    goal = references.get("goal")
    if goal and goal.get("task") and goal["task"] != task:
        goal = None  # another task's goal says nothing about this one
    # anchors and published numbers were measured on one task: references.yaml's `task`, else the goal's
    ref_task = references.get("task") or (references.get("goal") or {}).get("task")
    anchors, baselines = references.get("anchors") or [], references.get("baselines") or {}
    note = None
    if ref_task and ref_task != task and (anchors or baselines):
        anchors, baselines = [], {}
        note = (
            f"The anchors and published numbers of {REFERENCES} are for {ref_task}, not for this run's task "
            f"({task or 'unknown'}): not shown."
        )

    def text(this: dict[str, Any] | None, **kwargs: Any) -> str:
        rows = [r for r in (this, *profiles) if r]
        out = render_scorecard(
            rows, anchors=anchors, baselines=baselines, goal=goal, task=task, current=this and this["name"], **kwargs
        )
        return out + ("\n" + note + "\n" if note else "")

    with atomic_open(md_path) as f:
        f.write(text(row, untimed=[row["name"]] if row else ()))
    if logs is not None:
        preamble = [
            f"Untracked (`{RUN_LOG_DIR}/` is git-ignored, no DVC output): `{md_path}` with this run's minutes, "
            "commit and date, read from the run logs when the scorecard was drawn.",
            "",
            *run_stage_lines(logs),
        ]
        Path(runs_md_path).parent.mkdir(parents=True, exist_ok=True)
        with atomic_open(runs_md_path) as f:
            f.write(text(row and timed_row(row, logs), preamble=preamble))
    return [r for r in (row, *profiles) if r]
