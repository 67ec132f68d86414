"""The pipeline's plots as one self-contained HTML file (``reports/plots.html``), readable offline.

``dvc plots show`` writes an HTML page that loads Vega from a CDN, so offline it is blank. Here
the same plots, the ones ``dvc.yaml`` declares (its top-level ``plots:`` and the stages'
``plots:`` outputs), are turned into Vega-Lite specs much as DVC's templates do (``linear``: one
line per y column against x; ``confusion``: counts of (actual, predicted) pairs) and rendered to
SVG by ``vl-convert-python`` (the Vega project's converter: Vega-Lite, Vega and a JavaScript
engine in one wheel, no browser, no network). Each SVG is inlined in the page; nothing is
fetched when it is opened.

The learning curve (``plots/learning_curve.csv``) is written by ``make learning-curve``, not by
``dvc repro``: it can be left over from another pre-training run. Its rows carry the sha256 of
the final pre-trained checkpoint they come from (``pretrain_sha256``: the sha256 of ``best.pt``'s
bytes, else ``last.pt``'s, written by ``stages/cli/learning_curve.py``); the panel is drawn only when
that is the current ``data/pretrain/best.pt`` (hashed here: its bytes change only with the weights,
and the ``plots`` stage depends on that file alone; ``last.pt`` only where there is no ``best.pt``),
and otherwise replaced by a warning naming both hashes and the fix.

The page holds no time: the same data give the same bytes. The pre-training curves are drawn from
the columns dvc.yaml names (``step``, ``loss``, ``val_loss``), whatever else the CSVs hold.
"""

from __future__ import annotations

import csv
import html
import itertools
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import yaml

from pipeline.core.errors import BertraceError
from pipeline.core.io import atomic_open, sha256_file

REPORT = Path("reports/plots.html")
LEARNING_CURVE = "plots/learning_curve.csv"
SCHEMA = "https://vega.github.io/schema/vega-lite/v5.json"  # an identifier: vl-convert does not fetch it
MAX_POINTS = 4000  # rows per series drawn (evenly thinned above that; the CSV keeps every row)


@dataclass
class PlotDef:
    """One declared plot: ``y`` maps each CSV file to its y columns."""

    name: str
    y: dict[str, list[str]]
    x: str | None = None
    template: str = "linear"
    title: str | None = None
    x_label: str | None = None
    y_label: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def files(self) -> list[str]:
        return list(self.y)


# --------------------------------------------------------------------------------------------
# What dvc.yaml declares


def _as_list(v: Any) -> list[str]:
    if v is None:
        return []
    return [str(c) for c in v] if isinstance(v, (list, tuple)) else [str(v)]


IMAGES = (".png", ".jpg", ".jpeg", ".gif", ".svg")  # image plots: files of their own, drawn from a CSV here


def declared_plots(dvc_yaml: str | Path = "dvc.yaml") -> list[PlotDef]:
    """The plots of ``dvc_yaml``: the top-level ``plots:`` definitions, then each stage's
    ``plots:`` output whose file no top-level definition shows (e.g. the confusion matrix).
    Entries with unresolved ``${...}`` templating are skipped, and so are images (``reports/confusion.png``:
    the page draws the same data from its CSV)."""
    path = Path(dvc_yaml)
    if not path.is_file():
        raise BertraceError(f"{path}: not found; run from the repository root (or pass --root)")
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise BertraceError(f"{path}: not valid YAML ({e})") from None
    plots: list[PlotDef] = []
    for entry in doc.get("plots") or []:
        if isinstance(entry, str):
            plots.append(PlotDef(name=entry, y={entry: []}))
            continue
        if not isinstance(entry, dict):
            continue
        for name, spec in entry.items():
            spec = spec or {}
            y = spec.get("y")
            if isinstance(y, dict):
                ys = {str(f): _as_list(cols) for f, cols in y.items()}
            else:  # y: column(s) of the file named by the plot id
                ys = {str(name): _as_list(y)}
            x = spec.get("x")
            if isinstance(x, dict):  # {file: column}: one x column for all (as DVC requires for a linear plot)
                x = next(iter(x.values()), None)
            plots.append(
                PlotDef(
                    name=str(spec.get("title") or name),
                    y=ys,
                    x=x,
                    template=str(spec.get("template") or "linear"),
                    x_label=spec.get("x_label"),
                    y_label=spec.get("y_label"),
                )
            )
    shown = {f for p in plots for f in p.files}
    for stage, body in (doc.get("stages") or {}).items():
        for entry in (body or {}).get("plots") or []:
            file, spec = (entry, {}) if isinstance(entry, str) else next(iter(entry.items()))
            spec = spec if isinstance(spec, dict) else {}
            if file in shown or "${" in str(file) or str(file).lower().endswith(IMAGES):
                continue
            plots.append(
                PlotDef(
                    name=f"{stage}: {Path(file).stem.replace('_', ' ')}",
                    y={file: _as_list(spec.get("y"))},
                    x=spec.get("x"),
                    template=str(spec.get("template") or "linear"),
                    title=spec.get("title"),
                    x_label=spec.get("x_label"),
                    y_label=spec.get("y_label"),
                )
            )
            shown.add(file)
    return plots


# --------------------------------------------------------------------------------------------
# Data and Vega-Lite specs


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """CSV rows, numbers as floats (ints where whole), other cells as text."""

    def cell(v: str) -> Any:
        try:
            f = float(v)
        except ValueError:
            return v
        return int(f) if f.is_integer() and "." not in v and "e" not in v.lower() else f

    with open(path, encoding="utf-8", newline="") as f:
        return [{k: cell(v) for k, v in row.items() if k is not None} for row in csv.DictReader(f)]


def _thin(rows: list[dict[str, Any]], n: int = MAX_POINTS) -> list[dict[str, Any]]:
    if len(rows) <= n:
        return rows
    step = len(rows) / n
    return [rows[int(i * step)] for i in range(n)] + [rows[-1]]


def linear_spec(plot: PlotDef, data: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """One line per (file, y column) against ``plot.x`` (the row index when there is none), as
    DVC's ``linear`` template."""
    values = []
    several = len(data) > 1
    x = plot.x or "step"
    for file, rows in data.items():
        for col in plot.y[file]:
            series = f"{Path(file).name}: {col}" if several else col
            for i, row in enumerate(_thin(rows)):
                xv = row.get(x, i) if plot.x else i
                if isinstance(row.get(col), (int, float)) and isinstance(xv, (int, float)):
                    values.append({"x": xv, "y": row[col], "series": series})
    return {
        "$schema": SCHEMA,
        "width": 560,
        "height": 300,
        "data": {"values": values},
        "mark": {"type": "line", "point": len(values) <= 60, "tooltip": True},
        "encoding": {
            "x": {"field": "x", "type": "quantitative", "title": plot.x_label or x},
            "y": {
                "field": "y",
                "type": "quantitative",
                "title": plot.y_label or ", ".join(sorted({c for cols in plot.y.values() for c in cols})),
                "scale": {"zero": False},
            },
            "color": {"field": "series", "type": "nominal", "title": None, "legend": {"orient": "bottom"}},
        },
    }


def confusion_spec(plot: PlotDef, data: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Counts of (actual, predicted) as a heatmap with the numbers written in, as DVC's
    ``confusion`` template (x: predicted, y: actual)."""
    file, rows = next(iter(data.items()))
    x = plot.x or "predicted"
    y = (plot.y.get(file) or ["actual"])[0]
    counts = Counter((str(r.get(y)), str(r.get(x))) for r in rows)
    labels = sorted({a for a, _ in counts} | {p for _, p in counts})
    values = [{"actual": a, "predicted": p, "count": counts.get((a, p), 0)} for a in labels for p in labels]
    size = max(160, 60 * len(labels))
    axis = {"sort": labels}
    return {
        "$schema": SCHEMA,
        "width": size,
        "height": size,
        "data": {"values": values},
        "encoding": {
            "x": {"field": "predicted", "type": "nominal", "title": plot.x_label or x, **axis},
            "y": {"field": "actual", "type": "nominal", "title": plot.y_label or y, **axis},
        },
        "layer": [
            {
                "mark": "rect",
                "encoding": {"color": {"field": "count", "type": "quantitative", "scale": {"scheme": "blues"}}},
            },
            {
                "mark": {"type": "text", "fontSize": 13},
                "encoding": {
                    "text": {"field": "count", "type": "quantitative"},
                    "color": {
                        "condition": {"test": f"datum.count > {max(counts.values(), default=0) / 2}", "value": "white"},
                        "value": "black",
                    },
                },
            },
        ],
    }


def scatter_spec(plot: PlotDef, data: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """One point per row, y against x (DVC's ``scatter`` template), with the line y = x."""
    file, rows = next(iter(data.items()))
    x, y = plot.x or "x", (plot.y.get(file) or ["y"])[0]
    values = [
        {"x": r[x], "y": r[y]}
        for r in _thin(rows)
        if isinstance(r.get(x), (int, float)) and isinstance(r.get(y), (int, float))
    ]
    lo = min([min(v["x"], v["y"]) for v in values], default=0)
    hi = max([max(v["x"], v["y"]) for v in values], default=1)
    enc = {
        "x": {"field": "x", "type": "quantitative", "title": plot.x_label or x, "scale": {"zero": False}},
        "y": {"field": "y", "type": "quantitative", "title": plot.y_label or y, "scale": {"zero": False}},
    }
    return {
        "$schema": SCHEMA,
        "width": 360,
        "height": 360,
        "layer": [
            {"data": {"values": values}, "mark": {"type": "point", "opacity": 0.5, "tooltip": True}, "encoding": enc},
            {
                "data": {"values": [{"x": lo, "y": lo}, {"x": hi, "y": hi}]},
                "mark": {"type": "line", "color": "gray", "strokeDash": [4, 4]},
                "encoding": enc,
            },
        ],
    }


def render_svg(spec: dict[str, Any]) -> str:
    """SVG text of a Vega-Lite spec, rendered in-process by vl-convert (no network)."""
    try:
        import vl_convert
    except ImportError:
        raise BertraceError(
            "rendering plots offline needs vl-convert-python; pip install -e . (it is a dependency of bertrace)"
        ) from None
    return vl_convert.vegalite_to_svg(json.dumps(spec))


# --------------------------------------------------------------------------------------------
# The learning curve's checkpoint


FINAL_CHECKPOINTS = ("data/pretrain/best.pt", "data/pretrain/last.pt")  # a learning curve's last point, in order


def current_pretrain_sha256(root: Path) -> tuple[dict[str, str], str]:
    """``({checkpoint path: sha256}, where from)`` of the current final pre-trained checkpoint: the
    sha256 of ``data/pretrain/best.pt``'s bytes (of ``last.pt`` only where there is no best.pt), as
    the learning curve's ``pretrain_sha256`` column records it; ``({}, "")`` without either."""
    for p in FINAL_CHECKPOINTS:
        if (root / p).is_file():
            return {p: sha256_file(root / p)}, f"the sha256 of {p}"
    return {}, ""


def learning_curve_status(rows: list[dict[str, Any]], root: Path) -> dict[str, Any]:
    """Whether the learning-curve rows belong to the current pre-trained checkpoint.

    ``{"ok": bool, "curve_sha256", "current": {path: sha256}, "message"}``: ``ok`` only when the
    rows record the checkpoint they fine-tuned (``pretrain_sha256``) and it is the current
    best.pt or last.pt."""
    shas = {str(r.get("pretrain_sha256") or "") for r in rows}
    status: dict[str, Any] = {"ok": False, "curve_sha256": None, "current": {}}
    fix = "rerun `make learning-curve` on this checkpoint"
    if shas == {""} or len(shas) != 1:
        status["message"] = (
            f"not drawn: {LEARNING_CURVE} does not record which pre-trained checkpoint it belongs "
            f"to (no pretrain_sha256 column: written before that was recorded, or edited); {fix}"
        )
        return status
    curve = shas.pop()
    current, source = current_pretrain_sha256(root)
    status.update(curve_sha256=curve, current=current)
    match = next((p for p, h in current.items() if h == curve), None)
    if not current:
        status["message"] = (
            f"not drawn: the curve belongs to the pre-trained checkpoint sha256 {curve[:12]}, and "
            f"there is no {' or '.join(FINAL_CHECKPOINTS)} to compare it with; `dvc pull` or `dvc repro pretrain`"
        )
    elif match is None:
        now = ", ".join(f"{Path(p).name} {h[:12]}" for p, h in current.items())
        status["message"] = (
            f"STALE, not drawn: the curve was made from the pre-trained checkpoint sha256 "
            f"{curve[:12]}; the current one is {now} ({source}); {fix}"
        )
    else:
        status.update(ok=True, message=f"made from {match} sha256 {curve[:12]}: the current checkpoint ({source})")
    return status


# --------------------------------------------------------------------------------------------
# The page


def _panel(plot: PlotDef, root: Path) -> dict[str, Any]:
    """``{name, files: {file: sha256}, svg | None, notes: [...], status}`` of one plot."""
    panel: dict[str, Any] = {"name": plot.name, "files": {}, "svg": None, "notes": list(plot.notes), "status": "ok"}
    data: dict[str, list[dict[str, Any]]] = {}
    for file in plot.files:
        path = root / file
        if not path.is_file():
            panel["notes"].append(f"{file} not present (run the stage that writes it, or `dvc pull`)")
            continue
        panel["files"][file] = sha256_file(path)
        rows = read_rows(path)
        if not rows:
            panel["notes"].append(f"{file} has no rows (nothing to draw for this run's task)")
            continue
        if file == LEARNING_CURVE:  # which checkpoint it belongs to, before anything is drawn
            status = learning_curve_status(rows, root)
            panel["learning_curve"] = status
            panel["notes"].append(status["message"])
            if not status["ok"]:
                panel["status"] = "stale"
                continue
        if not plot.y[file]:  # DVC's default: the last column
            plot.y[file] = [list(rows[0])[-1]]
        missing = [c for c in [*plot.y[file], *([plot.x] if plot.x else [])] if c not in rows[0]]
        if missing:
            panel["notes"].append(f"{file} has no column {', '.join(missing)} (columns: {', '.join(rows[0])})")
            continue
        data[file] = rows
    if not data:
        if panel["status"] != "stale":
            panel["status"] = "missing"
        return panel
    drawn = PlotDef(
        plot.name, {f: plot.y[f] for f in data}, plot.x, plot.template, plot.title, plot.x_label, plot.y_label
    )
    spec = {"confusion": confusion_spec, "scatter": scatter_spec}.get(plot.template, linear_spec)(drawn, data)
    panel["svg"] = render_svg(spec)
    return panel


_CSS = """body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:2em auto;max-width:980px;color:#222}
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:2em;border-bottom:1px solid #ddd;padding-bottom:.2em}
.meta,.files{color:#555;font-size:.85em}.files code{background:#f4f4f4;padding:0 .3em}
.note{background:#f6f8fa;border-left:4px solid #888;padding:.4em .8em;margin:.5em 0;font-size:.9em}
.stale{background:#fff4e5;border-left-color:#e8590c}.ok{border-left-color:#2b8a3e}svg{max-width:100%;height:auto}"""


_SVG_REF = re.compile(r'(id="|url\(#|href="#)([A-Za-z_-]+[0-9]+)(?=[")])')


def _page_ids(svg: str, numbers: Iterator[int], names: dict[str, str]) -> str:
    """``svg`` with its numbered ids (``gradient_3``, ``clip12``) renumbered in page order: vl-convert
    counts them per process, so the same data would otherwise give other bytes after other plots."""

    def new(m: re.Match) -> str:
        old = m.group(2)
        if old not in names:
            names[old] = re.sub(r"[0-9]+$", "", old) + str(next(numbers))
        return m.group(1) + names[old]

    return _SVG_REF.sub(new, svg)


def render_html(panels: list[dict[str, Any]], *, title: str = "bertrace plots") -> str:
    """One HTML document: every panel's SVG inline, its files with their sha256, its notes. No
    time stamp: the same data gives the same bytes (the files' hashes say which data it is; SVG ids
    numbered in page order)."""
    numbers = itertools.count()
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        '<p class="meta">The plots dvc.yaml declares, rendered offline (vl-convert, Vega-Lite to SVG); '
        "written by <code>bertrace plots</code> (the DVC stage <code>plots</code>). "
        "<code>dvc plots show</code> draws the same data but needs the internet (Vega from a CDN).</p>",
    ]
    for p in panels:
        out.append(f'<section data-plot="{html.escape(p["name"])}" data-status="{p["status"]}">')
        out.append(f"<h2>{html.escape(p['name'])}</h2>")
        if p["files"]:
            out.append(
                '<p class="files">'
                + " · ".join(
                    f"<code>{html.escape(f)}</code> sha256 <code>{s[:12]}</code>" for f, s in p["files"].items()
                )
                + "</p>"
            )
        for note in p["notes"]:
            kind = "stale" if p["status"] == "stale" else ("ok" if p.get("learning_curve", {}).get("ok") else "")
            out.append(f'<p class="note {kind}">{html.escape(note)}</p>')
        if p["svg"]:
            out.append(f"<figure>{_page_ids(p['svg'], numbers, {})}</figure>")
        out.append("</section>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def write_plots_report(
    out: str | Path = REPORT, root: str | Path = ".", dvc_yaml: str | Path | None = None
) -> dict[str, Any]:
    """Render every declared plot under ``root`` into ``out``; returns
    ``{"path", "plots": [{name, status (ok | stale | missing), files, notes}], "learning_curve": status
    or None}``."""
    root = Path(root)
    plots = declared_plots(dvc_yaml or root / "dvc.yaml")
    panels = [_panel(p, root) for p in plots]
    text = render_html(panels)
    with atomic_open(root / out if not Path(out).is_absolute() else out) as f:
        f.write(text)
    curve = next((p["learning_curve"] for p in panels if "learning_curve" in p), None)
    return {
        "path": str(out),
        "plots": [{k: p[k] for k in ("name", "status", "files", "notes")} for p in panels],
        "learning_curve": curve,
    }
