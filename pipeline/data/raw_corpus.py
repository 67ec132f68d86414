"""The contract between the download and clean stages: ``data/raw/manifest.json`` names the
corpus format and its Parquet parts (``text``, ``source``; docs/formats.md "Raw corpus"). Kept
apart from the download code (pipeline/data/download.py) so that the clean stage imports none of it."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.core.errors import BertraceError

FORMATS = ("wikitext", "wikiextractor", "documents")


def load_raw_manifest(raw_dir: Path) -> dict:
    """The download manifest of ``raw_dir``, checked for the fields the clean stage needs."""
    path = Path(raw_dir) / "manifest.json"
    if not path.exists():
        raise BertraceError(f"{path}: not found; run the download stage first (dvc repro download)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BertraceError(f"{path}: not valid JSON ({e}); rerun the download stage") from None
    if manifest.get("format") not in FORMATS or not isinstance(manifest.get("parts"), list):
        raise BertraceError(f"{path}: not a bertrace download manifest (no format/parts); rerun the download stage")
    return manifest
