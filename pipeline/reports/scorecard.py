"""The scorecard: this project's runs next to the stock Hugging Face route and published numbers.

One row per run: corpus, model, pre-training minutes and device, the fine-tuning task's
validation accuracy (mean ± std over seeds), held-out test accuracy, the whole DAG's wall
minutes and a hash of every stage's params (so two rows with the same hash ran the same recipe).
``run_row`` builds the row of the run in ``data/`` from its metrics and provenance records;
rows of other profiles (in-domain pre-training, the GPU profile, ...) are such rows recorded
earlier into ``reports/profiles/<name>.json`` (``bertrace scorecard record NAME``) and shown
beside it. ``render_scorecard`` makes the markdown; the evaluate stage writes its row
(``write_run_row``) and the ``scorecard`` stage draws the markdown (``write_scorecard``) beside
the anchors, published numbers and goals of ``reports/references.yaml``, so that editing a
reference number reruns a one-second stage, not evaluate.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any, Iterable, Sequence

from pipeline.core.errors import BertraceError
from pipeline.core.io import atomic_open, sha256_json, write_json
from pipeline.lineage.provenance import STAGE_ORDER
from pipeline.finetune.task_metrics import SELECTION

SCORECARD_JSON = Path("reports/scorecard.json")  # the evaluate stage's rows; `scorecard record` reads it
SCORECARD_MD = Path("reports/scorecard.md")  # the same rows as markdown, beside anchors and published numbers
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
    "pretrain_sha",
)  # the pre-trained weights' model_sha256 (12 hex): joins a row to its checkpoint's IMDB row
VARIANTS_DIR = Path("reports/variants")  # finetune_variant@<name>: reports/variants/<name>.json
_SELECTION_KEYS = tuple(f"validation_{m}" for m in SELECTION.values())  # reports/<stage>.json, per task type


def read_variants(
    directory: str | Path = VARIANTS_DIR, names: Iterable[str] | None = None
) -> dict[str, dict[str, Any]]:
    """``{name: {mode, settings, dev_mean, dev_std, seeds, minutes}}`` from the ``finetune_variant``
    stages' ``reports/variants/<name>.json`` (dev in %, as the scorecard's rows); {} without any.
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
            "minutes": d.get("wall_minutes"),
        }
    return out


def _minutes(record: dict[str, Any]) -> float | None:
    try:
        start = dt.datetime.fromisoformat(record["started"])
        end = dt.datetime.fromisoformat(record["finished"])
    except (KeyError, TypeError, ValueError):
        return None
    return (end - start).total_seconds() / 60.0


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
    extra_minutes: float = 0.0,
    warnings: Sequence[str] = (),
) -> dict[str, Any]:
    """The scorecard row of one pipeline run.

    ``records``: provenance records by stage (data/provenance/<stage>.json);
    ``finetune_metrics`` / ``eval_metrics`` / ``pretrain_metrics``: all the stages' numbers (reports/<stage>.json);
    ``extra_minutes``: time not in any record yet (the evaluate stage's own, while it runs);
    ``warnings``: :func:`pipeline.evaluate.report.collapse_warnings` (the row is marked ⚠).
    """
    # a published encoder (pipeline/interop/hf_import.py): no corpus or pre-training of ours behind the row
    imported = ((records.get("finetune") or {}).get("upstream") or {}).get("imported")
    missing = [s for s in ("finetune",) + (() if imported else ("download",)) if s not in records]
    if missing:
        raise BertraceError(
            f"data/provenance: no record for {missing}; run the whole pipeline (dvc repro) before making the scorecard"
        )
    acc = finetune_metrics.get("validation_accuracy") or {}
    if not isinstance(acc, dict) or "mean" not in acc:
        raise BertraceError("reports/finetune.json: no validation_accuracy mean; rerun dvc repro finetune")
    pretrain_metrics = {} if imported else pretrain_metrics or {}
    minutes = {s: _minutes(records[s]) for s in (("finetune",) if imported else PIPELINE_STAGES) if s in records}
    if minutes.get("pretrain") is not None and "train_seconds" in pretrain_metrics:
        # a pre-training resumed from a finished last.pt ran seconds; its weights took train_seconds
        minutes["pretrain"] = max(minutes["pretrain"], pretrain_metrics["train_seconds"] / 60.0)
    dag = sum(m for m in minutes.values() if m is not None) + extra_minutes
    git = records["finetune"].get("git") or {}
    mode = (records["finetune"].get("params") or {}).get("mode", "full")
    objective = ((records.get("pretrain") or {}).get("params") or {}).get("objective") if mode != "scratch" else None
    val_metric = _own_val_metric(pretrain_metrics) if objective else None
    return {
        "name": name,
        "corpus": (
            f"published: {imported.get('source')}@{str(imported.get('resolved_revision') or 'local')[:10]}"
            if imported
            else _corpus(records["download"].get("params") or {})
        ),
        "model": _model(model_config) + ("" if mode == "full" else f" ({mode})"),
        "pretrain_minutes": (
            round(pretrain_metrics["train_seconds"] / 60.0, 2)
            if mode != "scratch" and "train_seconds" in pretrain_metrics
            else None
        ),
        "device": pretrain_metrics.get("device", "—"),
        "tokens_seen": pretrain_metrics.get("tokens_seen"),
        "pretrain_budget": _budget(pretrain_metrics) if mode != "scratch" else None,
        "task": task,
        "dev_mean": round(100 * float(acc["mean"]), 2),
        "dev_std": round(100 * float(acc.get("std", 0.0)), 2),
        "seeds": int(finetune_metrics.get("n_seeds") or len(finetune_metrics.get("per_seed") or {}) or 1),
        "test": round(100 * float(eval_metrics["test"]["accuracy"]), 2) if "test" in eval_metrics else None,
        "imdb_test": None,
        "dag_minutes": round(dag, 1),
        "params_hash": sha256_json({s: records[s].get("params_hash") for s in PIPELINE_STAGES if s in records})[:12],
        "git_commit": (git.get("commit") or "")[:10] or None,
        "git_dirty": git.get("dirty"),
        "date": str(records["finetune"].get("finished") or "")[:10] or None,
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


def render_scorecard(
    rows: Sequence[dict[str, Any]],
    *,
    anchors: Iterable[dict[str, Any]] = (),
    baselines: dict[str, float] | None = None,
    goal: dict[str, float] | None = None,
    task: str | None = None,
) -> str:
    """The scorecard as markdown: this project's rows, then the anchors and published numbers."""
    task = task or "the task"
    rows = with_imdb_test(rows)
    lines = [
        "# Scorecard",
        "",
        f"Validation accuracy on {task} (mean ± std over fine-tuning seeds), drawn by the `scorecard` stage "
        "from the `evaluate` stage's row, rows of other profiles (`reports/profiles/*.json`) and "
        "`reports/references.yaml`.",
        "",
    ]
    if goal:
        gain = goal.get("gain_over_scratch")
        lines += [
            f"Goal: ≥ {goal['dev_mean']:.1f} % mean of {goal_seeds(goal)} seeds with the whole DAG in ≤ "
            f"{goal['dag_minutes']:.0f} minutes on 2 CPU cores"
            + (
                f", and ≥ +{gain:.1f} points over the same model from random weights (its `scratch` variant, "
                f"as many seeds)"
                if gain is not None
                else ""
            )
            + ".",
            "",
        ]
    lines += [
        "## This project",
        "",
        "| run | corpus | model | pre-training | dev acc. (%) | test acc. (%) | IMDB test (%) | DAG wall | "
        "params hash | commit |",
        "|---|---|---|---|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        pre = (
            "none"
            if r.get("pretrain_minutes") is None
            else f"{r['pretrain_minutes']:.1f} min {r.get('device') or ''}".strip()
        )
        if r.get("objective") and r.get("pretrain_minutes") is not None:
            pre = f"{r['objective']}, {pre}"
        if str(r.get("pretrain_budget") or "").startswith("time_minutes"):
            pre += " (wall-clock budget: not reproducible)"
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
    if notes:
        lines += [""] + notes
    if goal:
        same_task = [r for r in rows if not goal.get("task") or r.get("task") == goal["task"]]
        fast = [
            r
            for r in same_task
            if r["dev_mean"] >= goal["dev_mean"]
            and r.get("seeds", 0) >= goal_seeds(goal)
            and (r.get("dag_minutes") or 1e9) <= goal["dag_minutes"]
        ]
        gain = goal.get("gain_over_scratch")
        gains = {r["name"]: gain_over_scratch(r) for r in fast}
        met = [r for r in fast if gain is None or (gains[r["name"]] is not None and gains[r["name"]] >= gain - 1e-9)]
        lines += ["", f"Goal met by: {', '.join(r['name'] for r in met) if met else 'none of these rows'}."]
        short = [f"{r['name']} ({_fmt(gains[r['name']], '+.2f')})" for r in fast if r not in met]
        if short:
            lines += ["", f"Accuracy and time met, but not +{gain:.1f} over random weights: {', '.join(short)}."]
    with_variants = [r for r in rows if r.get("variants")]
    if with_variants:
        lines += [
            "",
            "## Fine-tuning variants",
            "",
            "The `finetune_variant@<name>` stages (params.yaml `finetune_variants`): the run's checkpoint, task "
            "and seeds fine-tuned again with other settings. `frozen`: a linear probe on the frozen encoder "
            "(what its features alone carry); `scratch`: the same model from random weights (what "
            "pre-training adds). Δ: against the run's own `finetune` (full) row above.",
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
    lines += objective_corpus_table(rows, task)
    anchors = list(anchors)
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
    return "\n".join(lines).rstrip() + "\n"


GRID_OBJECTIVES = ("mlm_nsp", "mlm", "electra")  # the objective x corpus grid; other objectives join it


def objective_corpus_table(rows: Sequence[dict[str, Any]], task: str | None) -> list[str]:
    """Markdown lines: every pre-trained row of ``task`` by corpus and objective, with the objective's own
    validation loss, dev, the frozen probe, the gain over the same model from random weights (the
    ``scratch`` variant), IMDB test and minutes; a grid objective a corpus has no row for says so."""
    pre = [
        r
        for r in rows
        if r.get("objective") and r.get("pretrain_minutes") is not None and (task is None or r.get("task") == task)
    ]
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
    the DAG's (the evaluate stage that made the row does not wait for them)."""
    extra = sum(v.get("minutes") or 0.0 for v in variants.values())
    return {**row, "variants": variants, "dag_minutes": round((row.get("dag_minutes") or 0.0) + extra, 1)}


def write_run_row(row: dict[str, Any] | None, json_path: str | Path = SCORECARD_JSON) -> None:
    """The evaluated run's own row (``{"this_run": row}``), read by ``write_scorecard``."""
    write_json(json_path, {"this_run": row})


def write_scorecard(
    row: dict[str, Any] | None,
    *,
    references: dict[str, Any],
    task: str | None = None,
    profiles_dir: str | Path = PROFILES_DIR,
    md_path: str | Path = SCORECARD_MD,
    variants: dict[str, dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Write ``md_path`` from ``row`` (the run in ``data/``, or None), the rows recorded in
    ``profiles_dir`` (a recorded row named like ``row`` is that run's older copy and is left out) and
    ``references`` (:func:`read_references`; the goal, the anchors and the published numbers are
    shown only when ``task`` is theirs: the goal's ``task``, or references.yaml's top-level ``task``,
    and "Goal met by" counts only rows of that task). Returns the rows shown."""
    if row is not None and variants:
        row = with_variants(row, variants)
    profiles = [r for r in read_profiles(profiles_dir) if row is None or r["name"] != row["name"]]
    rows = [r for r in (row, *profiles) if r]
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
    text = render_scorecard(rows, anchors=anchors, baselines=baselines, goal=goal, task=task)
    if note:
        text += "\n" + note + "\n"
    with atomic_open(md_path) as f:
        f.write(text)
    return rows
