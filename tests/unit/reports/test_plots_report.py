"""``bertrace plots``: the plots the repository's dvc.yaml declares, in one HTML file that opens
offline (inline SVG, nothing fetched), and a learning curve drawn only for the current
pre-trained checkpoint (stale or unidentified curves are flagged, not drawn)."""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.io import sha256_file
from pipeline.reports.learning_curve import COLUMNS, write_curve_csv

pytest.importorskip("vl_convert", reason="vl-convert-python not installed (a dependency: pip install -e .)")
from pipeline.reports.plots import declared_plots, learning_curve_status, read_rows, write_plots_report  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
CONFUSION = (
    [("negative", "negative")] * 7
    + [("negative", "positive")] * 2
    + [("positive", "negative")] * 3
    + [("positive", "positive")] * 11
)


def _write_csv(path: Path, header: list[str], rows: list[list]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def _curve_rows(sha: str | None) -> list[dict]:
    rows = [
        {
            "pretrain_steps": s,
            "pretrain_minutes": s / 100,
            "dev_accuracy": a,
            "dev_std": 0.01,
            "seeds": 2,
            "steps": 300,
            "checkpoint": c,
        }
        for s, a, c in (
            (0, 0.71, "scratch"),
            (500, 0.77, "data/pretrain/snapshots/step-000500.pt"),
            (1000, 0.8, "data/pretrain/best.pt"),
        )
    ]
    return [{**r, "pretrain_sha256": sha} if sha else r for r in rows]


@pytest.fixture
def repo(tmp_path) -> Path:
    """A repository with this project's dvc.yaml, every plot file of a run (the pre-training curves
    without timing columns), a pre-trained checkpoint and a learning curve made from it."""
    root = tmp_path / "repo"
    root.mkdir()
    shutil.copyfile(REPO / "dvc.yaml", root / "dvc.yaml")
    _write_csv(
        root / "plots/pretrain_loss.csv",
        ["step", "loss", "mlm_loss", "nsp_loss"],
        [[s, 10 - s / 50, 9.3 - s / 50, 0.69] for s in range(20, 420, 20)],
    )
    _write_csv(
        root / "plots/pretrain_val.csv",
        ["step", "val_loss", "val_mlm_loss", "val_nsp_loss"],
        [[s, 7.68 - s / 400, 7 - s / 400, 0.68] for s in (100, 200, 300, 400)],
    )
    _write_csv(root / "plots/confusion.csv", ["actual", "predicted"], [list(r) for r in CONFUSION])
    best = root / "data/pretrain/best.pt"
    best.parent.mkdir(parents=True)
    best.write_bytes(b"pre-trained weights, run A")
    (root / "data/pretrain/last.pt").write_bytes(b"last weights, run A")
    write_curve_csv(root / "plots/learning_curve.csv", _curve_rows(sha256_file(best)))
    return root


def _sections(html: str) -> dict[str, tuple[str, str]]:
    """{plot name: (status, body)} of the report's sections."""
    return {
        m.group(1): (m.group(2), m.group(3))
        for m in re.finditer(r'<section data-plot="([^"]+)" data-status="([^"]+)">(.*?)</section>', html, re.S)
    }


def test_every_declared_plot_is_inline_svg_and_nothing_is_fetched(repo):
    summary = write_plots_report("reports/plots.html", repo)
    html = (repo / "reports/plots.html").read_text(encoding="utf-8")
    sections = _sections(html)
    declared = [p.name for p in declared_plots(repo / "dvc.yaml")]
    assert list(sections) == declared
    for name in ("pretraining loss", "pretraining validation", "learning curve", "evaluate: confusion"):
        status, body = sections[name]
        assert status == "ok", (name, body[:500])
        assert body.count("<svg") == 1, name  # one inline SVG per plot
    # self-contained: no scripts at all, no stylesheet / image / font fetched from anywhere
    assert "<script" not in html
    assert not re.search(r'(src|href)\s*=\s*["\']?(https?:)?//', html)
    assert "@import" not in html and "url(http" not in html
    # the data is in the pictures: series names, and the confusion counts written in the cells
    loss = sections["pretraining loss"][1]
    assert ">loss<" in loss  # the column every objective writes (dvc.yaml)
    conf = re.findall(r"<text[^>]*>(\d+)</text>", sections["evaluate: confusion"][1])
    assert {2, 3, 7, 11} <= {int(c) for c in conf}
    curve = sections["learning curve"][1]
    assert f"made from data/pretrain/best.pt sha256 {sha256_file(repo / 'data/pretrain/best.pt')[:12]}" in curve
    assert summary["learning_curve"]["ok"] is True
    # files named with their hashes, so the page says which data it shows
    assert sha256_file(repo / "plots/confusion.csv")[:12] in sections["evaluate: confusion"][1]


def test_a_learning_curve_from_another_pretraining_run_is_flagged_not_drawn(repo):
    # pre-training reran (run B): the committed curve still names run A's checkpoint
    old = sha256_file(repo / "data/pretrain/best.pt")
    (repo / "data/pretrain/best.pt").write_bytes(b"pre-trained weights, run B")
    new = sha256_file(repo / "data/pretrain/best.pt")

    summary = write_plots_report("reports/plots.html", repo)
    status, body = _sections((repo / "reports/plots.html").read_text(encoding="utf-8"))["learning curve"]
    assert status == "stale" and "<svg" not in body
    assert "STALE" in body and old[:12] in body and new[:12] in body and "make learning-curve" in body
    assert summary["learning_curve"] == {**summary["learning_curve"], "ok": False, "curve_sha256": old}
    # the other plots are still drawn
    assert [p["status"] for p in summary["plots"] if p["name"] != "learning curve"][:3] == ["ok", "ok", "ok"]


def test_a_learning_curve_that_names_no_checkpoint_is_flagged(repo):
    write_curve_csv(repo / "plots/learning_curve.csv", _curve_rows(None))  # as committed before this column
    write_plots_report("reports/plots.html", repo)
    status, body = _sections((repo / "reports/plots.html").read_text(encoding="utf-8"))["learning curve"]
    assert status == "stale" and "<svg" not in body
    assert "does not record which pre-trained checkpoint" in body


def test_the_checkpoint_is_identified_by_the_bytes_of_best_pt_alone(repo):
    """The curve's checkpoint is compared with the sha256 of data/pretrain/best.pt (the plots stage's one
    dep on pre-training), not with data/provenance/pretrain.json, which changes with pre-training's code;
    last.pt only where there is no best.pt."""
    rows = read_rows(repo / "plots/learning_curve.csv")
    status = learning_curve_status(rows, repo)
    assert status["ok"] and "the sha256 of data/pretrain/best.pt" in status["message"]
    (repo / "data/provenance").mkdir(parents=True)
    (repo / "data/provenance/pretrain.json").write_text(
        json.dumps({"stage": "pretrain", "outputs": {"data/pretrain/best.pt": "f" * 64}, "code": {"x.py": "0" * 64}})
    )
    (repo / "data/pretrain/last.pt").write_bytes(b"last weights, another run")
    assert learning_curve_status(rows, repo) == status  # neither the record nor last.pt counts
    (repo / "data/pretrain/last.pt").write_bytes((repo / "data/pretrain/best.pt").read_bytes())
    (repo / "data/pretrain/best.pt").unlink()
    status = learning_curve_status(rows, repo)
    assert status["ok"] and "the sha256 of data/pretrain/last.pt" in status["message"]
    shutil.rmtree(repo / "data/pretrain")
    status = learning_curve_status(rows, repo)
    assert not status["ok"] and "dvc pull" in status["message"]


def test_the_page_depends_on_its_inputs_alone(repo):
    """reports/plots.html: the same bytes whatever the run logs and provenance records say (they are no
    deps of the plots stage), and no time in it; the pre-training curves need no timing columns."""
    write_plots_report("reports/plots.html", repo)
    first = (repo / "reports/plots.html").read_bytes()
    (repo / "runs").mkdir()
    (repo / "runs/pretrain.json").write_text(json.dumps({"stage": "pretrain", "seconds": 99.0}))
    (repo / "data/provenance").mkdir(parents=True)
    (repo / "data/provenance/pretrain.json").write_text(json.dumps({"stage": "pretrain", "outputs": {}}))
    write_plots_report("reports/plots.html", repo)
    assert (repo / "reports/plots.html").read_bytes() == first
    html = first.decode("utf-8")
    assert not re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d", html) and "seconds" not in html and "tokens_per_s" not in html


def test_learning_curve_csv_has_the_checkpoint_column(tmp_path):
    assert COLUMNS[-1] == "pretrain_sha256"
    path = write_curve_csv(tmp_path / "c.csv", _curve_rows("ab" * 32))
    rows = list(csv.DictReader(open(path, encoding="utf-8")))
    assert {r["pretrain_sha256"] for r in rows} == {"ab" * 32}


def test_missing_files_and_columns_are_notes_not_errors(repo):
    (repo / "plots/pretrain_val.csv").unlink()
    _write_csv(repo / "plots/pretrain_loss.csv", ["step", "mlm_loss"], [[1, 2.0], [2, 1.5]])
    summary = {p["name"]: p for p in write_plots_report("reports/plots.html", repo)["plots"]}
    assert summary["pretraining validation"]["status"] == "missing"
    assert "not present" in summary["pretraining validation"]["notes"][0]
    assert summary["pretraining loss"]["status"] == "missing"
    assert "no column loss (columns: step, mlm_loss)" in summary["pretraining loss"]["notes"][0]


def test_bertrace_plots_command(repo):
    out = subprocess.run(
        [sys.executable, "-m", "stages.cli", "plots", "--root", str(repo)], cwd=REPO, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert "wrote reports/plots.html: 4 of" in out.stdout and (repo / "reports/plots.html").is_file()
    # the same data gives the same bytes (no time stamp): a DVC output that changes only with its inputs
    first = (repo / "reports/plots.html").read_bytes()
    subprocess.run(
        [sys.executable, "-m", "stages.cli", "plots", "--root", str(repo)], cwd=REPO, check=True, capture_output=True
    )
    assert (repo / "reports/plots.html").read_bytes() == first
    bad = subprocess.run(
        [sys.executable, "-m", "stages.cli", "plots", "--root", str(repo / "nowhere")],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "dvc.yaml: not found" in bad.stderr
