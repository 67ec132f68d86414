"""The scorecard as markdown (``reports/scorecard.md``, and ``runs/scorecard.md`` with this run's
minutes, commit and date): this run, its variants and the goal verdict first, then the anchors and
published numbers of ``reports/references.yaml``, then the past experiments recorded in
``reports/profiles/`` and the objective × corpus table. The rows come from
:mod:`pipeline.reports.scorecard`; only the ``scorecard`` stage draws this, so editing how the card
looks reruns that one-second stage and nothing else.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Sequence

from pipeline.core.io import atomic_open
from pipeline.lineage.runlog import RUN_LOG_DIR
from pipeline.reports.scorecard import (
    PROFILES_DIR,
    REFERENCES,
    RUNS_SCORECARD_MD,
    SCORECARD_MD,
    dag_minutes,
    is_pretrained,
    read_profiles,
    stage_minutes,
    timed_row,
    untimed_row,
    with_variants,
)


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
            f"| {stage} | {_fmt(stage_minutes(log), '.1f')} | {_fmt((log or {}).get('finished'))} | "
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
