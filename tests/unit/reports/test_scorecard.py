"""Scorecard rows from the chain a checkpoint embeds and the stages' reports, recorded profiles, the
markdown, and this run's minutes, commit and date: read from the run logs into the untracked
runs/scorecard.md, never into the DVC outputs reports/scorecard.{json,md}."""

from __future__ import annotations

import json
import re

import pytest

from pipeline.core.errors import BertraceError
from pipeline.reports.scorecard import (
    TIMED_KEYS,
    dag_minutes,
    read_profiles,
    run_logs,
    run_row,
    timed_row,
)
from pipeline.reports.scorecard_md import render_scorecard

STAGES = ["download", "clean", "tokenizer", "examples", "validate", "pretrain", "finetune"]


def _records(pretrain_params_hash="p" * 64):
    """The chain a fine-tuned checkpoint embeds: params and hashes, no run fields."""
    recs = {
        s: {"stage": s, "params_hash": pretrain_params_hash if s == "pretrain" else s * 3, "params": {}}
        for s in STAGES
        if s != "validate"
    }
    recs["download"]["params"] = {"source": "local", "local": {"path": "../shared/data/enwiki-extract"}}
    recs["finetune"]["params"] = {"mode": "full"}
    return recs


def _log(stage, seconds, *, commit="0123456789abcdef", day="2026-12-01", timings=None, dirty=False):
    return {
        "stage": stage,
        "record_sha256": "r" * 64,
        "git": {"commit": commit, "dirty": dirty},
        "started": f"{day}T03:00:00+00:00",
        "finished": f"{day}T03:{int(seconds // 60) % 60:02d}:00+00:00",
        "seconds": seconds,
        "host": "somewhere",
        "timings": timings or {},
    }


def _write_logs(root, seconds: dict, **kw):
    """runs/<stage>.json for each stage of ``seconds`` ({stage: seconds}); pretrain's timings: 38 minutes
    of training at 20,000 tokens/s."""
    (root / "runs").mkdir(parents=True, exist_ok=True)
    for stage, secs in seconds.items():
        timings = {"train_seconds": 2280.0, "tokens_per_s": 20000.0} if stage == "pretrain" else None
        (root / "runs" / f"{stage}.json").write_text(json.dumps(_log(stage, secs, timings=timings, **kw)))


FT = {"validation_accuracy": {"mean": 0.8412, "std": 0.0031}, "n_seeds": 3}
EV = {"validation": {"accuracy": 0.85}, "test": {"accuracy": 0.8301}}
PT = {"device": "cpu", "tokens_seen": 1000, "budget": {"kind": "max_steps", "value": 8000}}


def test_run_row_numbers():
    row = run_row(
        "default",
        records=_records(),
        finetune_metrics=FT,
        eval_metrics=EV,
        pretrain_metrics=PT,
        model_config={"num_layers": 2, "hidden_size": 128},
    )
    assert row["dev_mean"] == 84.12 and row["dev_std"] == 0.31 and row["seeds"] == 3
    assert row["test"] == 83.01 and row["model"] == "2L/128" and row["pretrained"] is True
    assert row["pretrain_budget"] == "max_steps=8000" and row["corpus"] == "local: ../shared/data/enwiki-extract"
    assert not set(TIMED_KEYS) & set(row)  # no minutes, commit or date: those are the run logs'
    other = run_row("x", records=_records("q" * 64), finetune_metrics=FT, eval_metrics=EV, pretrain_metrics=PT)
    assert other["params_hash"] != row["params_hash"]  # one stage's params differ -> another recipe
    scratch = _records()
    scratch["finetune"]["params"]["mode"] = "scratch"
    s = run_row("s", records=scratch, finetune_metrics=FT, eval_metrics=EV, pretrain_metrics=PT)
    assert s["pretrained"] is False and s["pretrain_budget"] is None and s["model"] == "— (scratch)"


def test_run_row_needs_the_records_and_metrics():
    recs = _records()
    del recs["download"]
    with pytest.raises(BertraceError, match="model.pt: its provenance has no download record"):
        run_row("x", records=recs, finetune_metrics=FT, eval_metrics=EV)
    with pytest.raises(BertraceError, match="no finetune record"):
        run_row("x", records={"download": _records()["download"]}, finetune_metrics=FT, eval_metrics=EV)
    with pytest.raises(BertraceError, match="reports/finetune.json"):
        run_row("x", records=_records(), finetune_metrics={}, eval_metrics=EV)
    scratch = {"finetune": {"stage": "finetune", "params": {"mode": "scratch"}, "params_hash": "f" * 64}}
    assert run_row("s", records=scratch, finetune_metrics=FT, eval_metrics=EV)["corpus"] is None  # no chain needed


def test_minutes_commit_and_date_come_from_the_run_logs(tmp_path):
    """run_logs: runs/<stage>.json of every DAG stage, variants included, when it belongs to the stage's
    record in data/provenance/; dag_minutes: the sum of their seconds; timed_row: this run's fields."""
    from pipeline.lineage.provenance import record_digest

    seconds = {s: 60.0 * (i + 1) for i, s in enumerate([*STAGES, "finetune_variant@frozen", "evaluate"])}
    _write_logs(tmp_path, seconds, day="2026-12-02")
    # clean's record is not the one its run log names: another run's outputs, not counted
    (tmp_path / "data" / "provenance").mkdir(parents=True)
    (tmp_path / "data" / "provenance" / "clean.json").write_text(json.dumps({"stage": "clean", "params": {}}))
    record = {"stage": "finetune", "params": {"mode": "full"}}
    (tmp_path / "data" / "provenance" / "finetune.json").write_text(json.dumps(record))
    log = {**_log("finetune", 420.0, day="2026-12-02", dirty=True), "record_sha256": record_digest(record)}
    (tmp_path / "runs" / "finetune.json").write_text(json.dumps(log))
    logs = run_logs(["frozen"], root=tmp_path)
    assert list(logs) == [*STAGES, "finetune_variant@frozen", "evaluate"]
    assert logs["clean"] is None and logs["finetune"]["seconds"] == 420.0
    assert dag_minutes(logs) == round((sum(seconds.values()) - seconds["clean"]) / 60, 1)
    assert dag_minutes({s: None for s in logs}) is None

    row = run_row("r", records=_records(), finetune_metrics=FT, eval_metrics=EV, pretrain_metrics=PT)
    row["variants"] = {"frozen": {"mode": "frozen", "dev_mean": 70.0, "dev_std": 0.1, "settings": "mode: frozen"}}
    timed = timed_row(row, logs)
    assert timed["pretrain_minutes"] == 38.0 and timed["pretrain_tokens_per_s"] == 20000.0
    assert timed["dag_minutes"] == dag_minutes(logs)
    assert (timed["git_commit"], timed["git_dirty"], timed["date"]) == ("0123456789", True, "2026-12-02")
    assert timed["variants"]["frozen"]["minutes"] == 8.0
    assert row["variants"]["frozen"] == {"mode": "frozen", "dev_mean": 70.0, "dev_std": 0.1, "settings": "mode: frozen"}
    empty = timed_row(row, run_logs([], root=tmp_path / "elsewhere"))
    assert all(empty[k] is None for k in TIMED_KEYS)


def test_profiles_and_markdown(tmp_path):
    row = {
        **run_row("this run", records=_records(), finetune_metrics=FT, eval_metrics=EV, pretrain_metrics=PT),
        "pretrain_minutes": 38.0,
        "dag_minutes": 50.5,
        "git_commit": "0123456789",
        "git_dirty": True,
    }
    (tmp_path / "in-domain.json").write_text(json.dumps({**row, "name": "in-domain", "dev_mean": 85.5, "seeds": 1}))
    profiles = read_profiles(tmp_path)
    assert [p["name"] for p in profiles] == ["in-domain"] and profiles[0]["imdb_test"] is None
    md = render_scorecard(
        [row, *profiles],
        anchors=[{"name": "HF", "model": "2L/128", "pretrain": "30 min", "dev": "82.45"}],
        baselines={"BERT-Tiny": 83.2},
        goal={"dev_mean": 84.0, "dag_minutes": 60},
        task="SST-2",
    )
    assert "| this run |" in md and "**84.12** ± 0.31 (3 seeds)" in md and "| HF | 2L/128 | 30 min | 82.45 |" in md
    assert "Goal met by: this run." in md  # in-domain has 1 seed: not a goal row
    assert "| BERT-Tiny | 83.2 |" in md and "0123456789 (dirty)" in md and "| mlm_nsp" not in md
    assert "| 38.0 min cpu |" in md and "| 50.5 min |" in md
    # this run's row in a DVC output: no minutes or commit; the goal's time bar is left to runs/scorecard.md
    untimed = {k: v for k, v in row.items() if k not in TIMED_KEYS}
    md = render_scorecard([untimed], goal={"dev_mean": 84.0, "dag_minutes": 60}, untimed=["this run"])
    assert "| max_steps=8000 cpu |" in md and "0123456789" not in md and " min |" not in md
    assert "Goal met by: none of these rows." in md
    assert "Accuracy met by this run; its DAG minutes, the time bar, are in `runs/scorecard.md`." in md
    assert "- **this run**: minutes, commit and date in `runs/scorecard.md`" in md
    slow = {**row, "dag_minutes": 75.0}
    assert "Goal met by: none of these rows." in render_scorecard([slow], goal={"dev_mean": 84.0, "dag_minutes": 60})
    # the gain over random weights (the scratch variant) as a third bar: 84.12 - 82.30 = +1.82 misses +2.0
    goal = {"dev_mean": 84.0, "dag_minutes": 60, "gain_over_scratch": 2.0}
    small_gain = {
        **row,
        "variants": {"scratch": {"mode": "scratch", "dev_mean": 82.30, "dev_std": 1.0, "settings": "mode: scratch"}},
    }
    md = render_scorecard([small_gain], goal=goal)
    assert "and ≥ +2.0 points over the same model from random weights" in md
    assert "Goal met by: none of these rows." in md
    assert "Accuracy and time met, but not +2.0 over random weights: this run (+1.82)." in md
    big_gain = {
        **row,
        "variants": {"scratch": {"mode": "scratch", "dev_mean": 82.12, "dev_std": 1.0, "settings": "mode: scratch"}},
    }
    md = render_scorecard([big_gain], goal=goal)
    assert "Goal met by: this run." in md and "Accuracy and time met" not in md
    assert "Goal met by: none of these rows." in render_scorecard([row], goal=goal)  # no scratch variant: unknown
    # goal.seeds: a mean of 3 seeds does not count where the goal asks for 5 (3 is the default)
    md = render_scorecard([big_gain], goal={**goal, "seeds": 5})
    assert "≥ 84.0 % mean of 5 seeds" in md and "Goal met by: none of these rows." in md
    assert "Goal met by: this run." in render_scorecard([{**big_gain, "seeds": 5}], goal={**goal, "seeds": 5})
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(BertraceError, match="broken.json: not valid JSON"):
        read_profiles(tmp_path)
    assert read_profiles(tmp_path / "absent") == []


def test_record_keeps_the_last_row_as_a_profile(tmp_path, monkeypatch, capsys):
    """A recorded row (a git-tracked input, made by an explicit command) keeps this run's minutes, commit
    and date, read from the run logs."""
    from stages.scorecard import main

    monkeypatch.chdir(tmp_path)
    assert main(["record", "x"]) == 2  # nothing evaluated yet
    row = run_row("this run", records=_records(), finetune_metrics=FT, eval_metrics=EV, pretrain_metrics=PT)
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "scorecard.json").write_text(json.dumps({"this_run": row, "profiles": []}))
    _write_logs(tmp_path, {s: 120.0 for s in [*STAGES, "evaluate"]}, day="2026-12-03")
    assert main(["record", "in-domain", "--note", "IMDB unsup", "--set", "imdb_test=86.5"]) == 0
    assert "recorded reports/profiles/in-domain.json" in capsys.readouterr().out
    saved = read_profiles(tmp_path / "reports" / "profiles")
    assert len(saved) == 1 and saved[0]["name"] == "in-domain" and saved[0]["imdb_test"] == 86.5
    assert saved[0]["note"] == "IMDB unsup" and saved[0]["dev_mean"] == row["dev_mean"]
    assert saved[0]["dag_minutes"] == 16.0 and saved[0]["pretrain_minutes"] == 38.0
    assert (saved[0]["git_commit"], saved[0]["date"]) == ("0123456789", "2026-12-03")
    assert main(["record", "y", "--set", "bogus=1"]) == 2


def test_render_rewrites_the_markdown_from_the_json_and_recorded_rows(tmp_path, monkeypatch, capsys):
    """`scorecard render`: a row recorded elsewhere (copied into reports/profiles/) shows up beside the
    evaluated run's row, goal and anchors from reports/references.yaml, without evaluating again; the goal
    of another task is not shown."""
    import yaml

    from stages.scorecard import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "references.yaml").write_text(
        yaml.safe_dump(
            {
                "goal": {"task": "nyu-mll/glue/sst2", "dev_mean": 84.0, "dag_minutes": 60},
                "baselines": {"BERT-Tiny": 83.2},
                "anchors": [{"name": "HF", "model": "2L/128", "pretrain": "30 min", "dev": "82.45"}],
            }
        )
    )
    assert main(["render"]) == 2 and "no rows" in capsys.readouterr().err
    assert not (tmp_path / "reports" / "scorecard.md").exists()  # nothing written
    row = {
        **run_row("this run", records=_records(), finetune_metrics=FT, eval_metrics=EV, pretrain_metrics=PT),
        "task": "nyu-mll/glue/sst2",
    }
    _write_logs(tmp_path, {s: 300.0 for s in [*STAGES, "evaluate"]})  # 40 minutes
    (tmp_path / "reports" / "profiles").mkdir(parents=True)
    (tmp_path / "reports" / "scorecard.json").write_text(json.dumps({"this_run": row}))
    (tmp_path / "reports" / "profiles" / "in-domain.json").write_text(
        json.dumps({**row, "name": "in-domain", "dev_mean": 82.5, "dev_std": 0.4})
    )
    # an older copy of the evaluated run's own row is not shown twice
    (tmp_path / "reports" / "profiles" / "this run.json").write_text(json.dumps({**row, "dev_mean": 70.0}))
    assert main(["render"]) == 0
    assert "2 rows (this run, in-domain)" in capsys.readouterr().out
    md = (tmp_path / "reports" / "scorecard.md").read_text()
    assert "Validation accuracy on nyu-mll/glue/sst2" in md and "| HF | 2L/128 | 30 min | 82.45 |" in md
    assert "**84.12** ± 0.31 (3 seeds)" in md and "**82.50** ± 0.40 (3 seeds)" in md and "**70.00**" not in md
    assert "Goal met by: none of these rows." in md and "Accuracy met by this run;" in md  # time: runs/
    assert "| BERT-Tiny | 83.2 |" in md
    # this run first, then the references, then the past experiments (#49): a reader finds their run at the top
    sections = [line for line in md.splitlines() if line.startswith("## ")]
    assert sections[0] == "## This run" and sections[-1] == "## Past experiments (`reports/profiles/*.json`)", sections
    assert (
        sections.index(
            "## Published (GLUE test server; other corpora, sizes and compute: a reference, not like-for-like)"
        )
        < len(sections) - 1
    )
    this_run = md[md.index("## This run") : md.index("## Anchors")]
    assert "| this run |" in this_run and "| in-domain |" not in this_run
    assert "| in-domain |" in md[md.index("## Past experiments") :]
    timed = (tmp_path / "runs" / "scorecard.md").read_text()
    assert "Goal met by: this run." in timed and "| 40.0 min |" in timed and "| BERT-Tiny | 83.2 |" in timed
    # the goal belongs to its task: an IMDB run's scorecard does not claim or miss the SST-2 goal
    (tmp_path / "reports" / "scorecard.json").write_text(json.dumps({"this_run": {**row, "task": "imdb"}}))
    assert main(["render"]) == 0
    assert "Goal met by" not in (tmp_path / "reports" / "scorecard.md").read_text()
    (tmp_path / "reports" / "scorecard.json").write_text(json.dumps({"this_run": row}))
    # the same through the `bertrace` command
    from stages.cli.main import main as bertrace

    (tmp_path / "reports" / "profiles" / "in-domain.json").unlink()
    with pytest.raises(SystemExit) as exit_:
        bertrace(["scorecard", "render"])
    assert exit_.value.code == 0 and "1 row (this run)" in capsys.readouterr().out
    assert "in-domain" not in (tmp_path / "reports" / "scorecard.md").read_text()


def test_a_custom_task_is_never_scored_against_another_tasks_goal(tmp_path):
    """A 5-class local task: no SST-2 goal, anchors or published numbers beside it; with the goal shown
    (an SST-2 run), rows of other tasks neither meet nor miss it."""
    from pipeline.reports.scorecard import task_name
    from pipeline.reports.scorecard_md import write_scorecard

    refs = {
        "goal": {"task": "nyu-mll/glue/sst2", "dev_mean": 84.0, "dag_minutes": 60},
        "anchors": [{"name": "HF", "model": "2L/128", "pretrain": "30 min", "dev": "82.45"}],
        "baselines": {"BERT-Tiny": 83.2},
    }
    five = task_name({"type": "local", "files": {"train": "data/reviews/train.csv", "validation": "dev.csv"}})
    assert five == "local: data/reviews/train.csv"
    assert task_name({"type": "hub", "dataset": "nyu-mll/glue", "config": "sst2"}) == "nyu-mll/glue/sst2"
    assert task_name(None) is None
    row = {
        **run_row(
            "5-class",
            records=_records(),
            finetune_metrics={"validation_accuracy": {"mean": 0.9, "std": 0.0}, "n_seeds": 3},
            eval_metrics=EV,
            pretrain_metrics=PT,
        ),
        "task": five,
        "dag_minutes": 10.0,
    }
    md_path = tmp_path / "scorecard.md"
    write_scorecard(row, references=refs, task=five, profiles_dir=tmp_path / "none", md_path=md_path)
    md = md_path.read_text()
    assert "Goal" not in md and "BERT-Tiny" not in md and "| HF |" not in md
    assert f"Validation accuracy on {five}" in md and "are for nyu-mll/glue/sst2, not for this run's task" in md
    # an SST-2 run beside a recorded 5-class row: the goal is SST-2's, only SST-2 rows can meet it
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "5-class.json").write_text(json.dumps(row))
    sst2 = {**row, "name": "this run", "task": "nyu-mll/glue/sst2", "dev_mean": 80.0}
    write_scorecard(
        sst2, references=refs, task="nyu-mll/glue/sst2", profiles_dir=tmp_path / "profiles", md_path=md_path
    )
    md = md_path.read_text()
    assert "Goal met by: none of these rows." in md and "| BERT-Tiny | 83.2 |" in md
    assert f"**90.00** ± 0.00 (3 seeds) on {five}" in md  # the other task's row says which task it is


def _variant_report(path, name, overrides, mean, std):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "variant": name,
                "overrides": overrides,
                "mode": overrides.get("mode", "full"),
                "best_validation_accuracy": mean + std,  # the best seed's (every task type writes it)
                "validation_accuracy": {"mean": mean, "std": std},
                "n_seeds": 3,
            }
        )
    )


def test_variants_table_from_the_variant_stages_and_recorded_rows(tmp_path, monkeypatch, capsys):
    """The finetune_variant stages' reports become the "Fine-tuning variants" table beside the
    run's full row (Δ against it); `record` keeps them with the row; a variant params.yaml no
    longer declares (its stale report DVC left behind) is not shown."""
    import yaml

    from pipeline.reports.scorecard import read_variants
    from stages.scorecard import main

    monkeypatch.chdir(tmp_path)
    reports = tmp_path / "reports"
    _variant_report(reports / "variants" / "frozen.json", "frozen", {"mode": "frozen", "lr": 1e-3}, 0.7512, 0.004)
    _variant_report(reports / "variants" / "scratch.json", "scratch", {"mode": "scratch"}, 0.8055, 0.002)
    _variant_report(reports / "variants" / "old.json", "old", {"lr": 5e-5}, 0.5, 0.0)
    (tmp_path / "params.yaml").write_text(
        yaml.safe_dump(
            {"finetune_variants": {"frozen": {"mode": "frozen", "lr": 1e-3}, "scratch": {"mode": "scratch"}}}
        )
    )
    assert list(read_variants(reports / "variants")) == ["frozen", "old", "scratch"]
    variants = read_variants(reports / "variants", names=["frozen", "scratch"])
    assert variants["frozen"] == {
        "mode": "frozen",
        "settings": "mode: frozen, lr: 0.001",
        "dev_mean": 75.12,
        "dev_std": 0.4,
        "seeds": 3,
    }
    row = run_row("this run", records=_records(), finetune_metrics=FT, eval_metrics=EV, pretrain_metrics=PT)
    (reports / "scorecard.json").write_text(json.dumps({"this_run": row}))
    seconds = {**{s: 60.0 for s in [*STAGES, "evaluate"]}, "finetune_variant@frozen": 135.0}
    _write_logs(tmp_path, {**seconds, "finetune_variant@scratch": 135.0, "finetune_variant@old": 600.0})
    assert main(["render"]) == 0
    md = (reports / "scorecard.md").read_text()
    assert "## Fine-tuning variants" in md and "| old |" not in md
    assert "| this run | full (`finetune`) | mode: full | 84.12 ± 0.31 | — | — |" in md
    assert "| this run | frozen | mode: frozen, lr: 0.001 | 75.12 ± 0.40 | -9.00 | — |" in md
    assert "| this run | scratch | mode: scratch | 80.55 ± 0.20 | -3.57 | — |" in md
    timed = (tmp_path / "runs" / "scorecard.md").read_text()
    assert "| this run | frozen | mode: frozen, lr: 0.001 | 75.12 ± 0.40 | -9.00 | 2.2 |" in timed
    assert "| 12.5 min |" in timed  # 8 stages x 1 minute + 2 x 2.25 minutes of variants (not old's)
    assert main(["record", "bert"]) == 0
    saved = read_profiles(reports / "profiles")[0]
    assert set(saved["variants"]) == {"frozen", "scratch"} and saved["variants"]["scratch"]["dev_mean"] == 80.55
    assert saved["dag_minutes"] == 12.5 and saved["variants"]["scratch"]["minutes"] == 2.2  # as runs/scorecard.md
    capsys.readouterr()


def test_a_regression_variant_shows_its_correlation_as_it_is(tmp_path):
    from pipeline.reports.scorecard import read_variants

    report = {"best_validation_pearson": 0.19, "validation_pearson": {"mean": 0.1771, "std": 0.0102}, "n_seeds": 3}
    (tmp_path / "stsb.json").write_text(json.dumps({"variant": "stsb", **report}))
    assert read_variants(tmp_path)["stsb"]["dev_mean"] == 0.1771  # a correlation, not a %
    (tmp_path / "stsb.json").write_text(json.dumps({"variant": "stsb", **report, "best_validation_pearson": None}))
    assert read_variants(tmp_path)["stsb"]["dev_std"] == 0.0102


def test_a_broken_variant_report_names_its_stage(tmp_path):
    from pipeline.reports.scorecard import read_variants

    (tmp_path / "frozen.json").write_text(json.dumps({"variant": "frozen", "per_seed": {}}))
    with pytest.raises(BertraceError, match=r"frozen.json: no best_validation_<metric> .*dvc repro finetune_variant@frozen"):
        read_variants(tmp_path)


def test_objective_by_corpus_table_and_the_objectives_own_val_loss():
    recs = _records()
    recs["pretrain"]["params"] = {"objective": "electra"}
    row = run_row(
        "el",
        records=recs,
        finetune_metrics=FT,
        eval_metrics=EV,
        task="glue/sst2",
        pretrain_metrics={**PT, "best_val_disc_loss": 0.23456789},
    )
    assert row["objective"] == "electra" and (row["val_metric"], row["val_loss"]) == ("val_disc_loss", 0.2346)
    hub = run_row(
        "h",
        records={
            **recs,
            "download": {
                **recs["download"],
                "params": {
                    "source": "hub",
                    "hub": {"dataset": "stanfordnlp/imdb", "config": "plain_text", "splits": ["unsupervised"]},
                },
            },
        },
        finetune_metrics=FT,
        eval_metrics=EV,
        pretrain_metrics=PT,
    )
    assert hub["corpus"] == "hub: stanfordnlp/imdb/plain_text (unsupervised)"
    row["variants"] = {
        "frozen": {"mode": "frozen", "dev_mean": 60.5, "dev_std": 1.0},
        "scratch": {"mode": "scratch", "dev_mean": 81.0, "dev_std": 0.2},
    }
    other_task = {**row, "name": "imdb", "task": "imdb"}
    md = render_scorecard([row, other_task], task="glue/sst2")
    table = md[md.index("## Pre-training objective × corpus") :]
    lines = [ln for ln in table.splitlines() if ln.startswith("| local:")]
    assert len(lines) == 3  # mlm_nsp and mlm not run, electra's row; the other task's row left out
    assert "| mlm_nsp | not run yet |" in lines[0] and "| mlm | not run yet |" in lines[1]
    assert lines[2].split(" | ")[1:8] == ["electra", "el", "val_disc_loss 0.235", "84.12 ± 0.31", "60.50", "+3.12", "—"]
    one_seed = render_scorecard([{**row, "seeds": 1, "dev_std": 0.0}], task="glue/sst2")
    assert "| 84.12 ± 0.00 (1 seed) |" in one_seed  # a single seed's "± 0.00" is not a measured spread


def test_imdb_test_column_joins_the_imdb_row_of_the_same_checkpoint():
    """An IMDB fine-tuning of the same pre-trained weights (same model_sha256) fills the SST-2 row's IMDB
    test column; another checkpoint's IMDB row does not."""
    sha = "ab" * 32
    recs = _records()
    recs["pretrain"]["params"] = {"objective": "mlm_nsp"}
    row = run_row(
        "this run",
        records=recs,
        finetune_metrics=FT,
        eval_metrics=EV,
        task="glue/sst2",
        pretrain_metrics={**PT, "model_sha256": sha},
    )
    assert row["pretrain_sha"] == sha[:12]
    scratch = run_row(
        "s",
        records={**recs, "finetune": {**recs["finetune"], "params": {"mode": "scratch"}}},
        finetune_metrics=FT,
        eval_metrics=EV,
        pretrain_metrics={**PT, "model_sha256": sha},
    )
    assert scratch["pretrain_sha"] is None  # no pre-trained weights behind a scratch row
    imdb = {**row, "name": "imdb-default", "task": "local: ../shared/data/imdb/train.parquet", "test": 86.25}
    other = {**row, "name": "other", "corpus": "elsewhere", "pretrain_sha": "cd" * 6}
    md = render_scorecard([row, imdb, other], task="glue/sst2")
    table = md[md.index("## Pre-training objective × corpus") :]
    cells = {ln.split(" | ")[2]: ln.split(" | ")[7] for ln in table.splitlines() if " | mlm_nsp | " in ln}
    assert cells == {"this run": "86.25", "other": "—"}, cells
    top = md[: md.index("## Pre-training objective × corpus")]
    assert [ln.split(" | ")[6] for ln in top.splitlines() if ln.startswith("| this run |")] == ["86.25"]
    assert render_scorecard([{**row, "imdb_test": 80.0}, imdb], task="glue/sst2").count("| 80.00 |") == 2  # --set wins


def test_a_rebuild_changes_runs_scorecard_md_not_the_dvc_outputs(tmp_path, monkeypatch, capsys):
    """Two renders of the same rows with other run logs (seconds, days, commits): reports/scorecard.md and
    reports/scorecard.json keep their bytes; runs/scorecard.md shows each run's minutes per stage and a DAG
    total that is the sum of the run logs' seconds, variants included, in every place it appears."""
    import yaml

    from pipeline.reports.scorecard import write_run_row
    from stages.scorecard import main

    monkeypatch.chdir(tmp_path)
    reports = tmp_path / "reports"
    _variant_report(reports / "variants" / "frozen.json", "frozen", {"mode": "frozen"}, 0.7512, 0.004)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"finetune_variants": {"frozen": {"mode": "frozen"}}}))
    (reports / "references.yaml").write_text(yaml.safe_dump({"goal": {"dev_mean": 84.0, "dag_minutes": 60}}))
    (reports / "profiles").mkdir()
    (reports / "profiles" / "older.json").write_text(
        json.dumps({"name": "older", "dev_mean": 83.0, "dev_std": 0.2, "seeds": 3, "dag_minutes": 44.4})
    )
    row = run_row("this run", records=_records(), finetune_metrics=FT, eval_metrics=EV, pretrain_metrics=PT)
    stages = [*STAGES, "finetune_variant@frozen", "evaluate"]
    outputs = []
    for secs, day, commit in [(100.0, "2026-12-01", "a" * 40), (170.0, "2026-12-09", "b" * 40)]:
        write_run_row(row)
        _write_logs(tmp_path, {s: secs + k for k, s in enumerate(stages)}, day=day, commit=commit)
        assert main(["render"]) == 0
        timed = (tmp_path / "runs" / "scorecard.md").read_text()
        dag = round(sum(secs + k for k in range(len(stages))) / 60, 1)
        assert f"| **DAG** | **{dag:.1f}** | | |" in timed  # the stage table's total ...
        assert f"| {dag:.1f} min | `" in timed  # ... is the row's DAG column
        assert f"| finetune_variant@frozen | {(secs + 7) / 60:.1f} | {day}T03:" in timed
        assert f"| {commit[:10]} |" in timed and "| 44.4 min |" in timed  # a recorded row keeps its minutes
        assert main(["show"]) == 0 and capsys.readouterr().out.endswith(timed)
        outputs.append(((reports / "scorecard.md").read_bytes(), (reports / "scorecard.json").read_bytes(), timed))
    (md_a, json_a, timed_a), (md_b, json_b, timed_b) = outputs
    assert md_a == md_b and json_a == json_b and timed_a != timed_b
    text = md_a.decode("utf-8")
    assert not re.search(r"20\d\d-\d\d-\d\d", text) and "aaaaaaaaaa" not in text and "| 44.4 min |" in text
    saved = json.loads(json_a)["this_run"]
    assert not set(TIMED_KEYS) & set(saved)


def test_the_row_of_an_imported_checkpoint_reads_the_chain_it_embeds():
    """A published encoder (finetune.checkpoint a Hugging Face directory): the fine-tuned checkpoint's
    provenance names the imported record under ``pretrain``; no corpus or pre-training of ours."""
    from pipeline.reports.scorecard import chain_records

    imported = {"stage": "imported", "source": "models/bert", "resolved_revision": None, "inputs": {}}
    provenance = {"stage": "finetune", "params": {"mode": "full"}, "params_hash": "f" * 64, "pretrain": imported}
    records = chain_records(provenance)
    assert set(records) == {"finetune", "imported"}
    row = run_row("hf", records=records, finetune_metrics=FT, eval_metrics=EV, pretrain_metrics=PT)
    assert row["corpus"] == "published: models/bert@local" and row["pretrained"] is False
    assert "| none |" in render_scorecard([row])
