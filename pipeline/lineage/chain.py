"""The provenance chain of a checkpoint as reports show it (the evaluation report's "Provenance"
section): each stage behind it with its params hash and the content hashes its record names, data
and params only, so the same checkpoint always renders the same bytes."""

from __future__ import annotations

from typing import Any

from pipeline.lineage.provenance import STAGE_ORDER, iter_records


def _is_sha256(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def _hashes(record: dict[str, Any]) -> dict[str, str]:
    """Every content hash a record names: inputs, outputs, ``*_sha256`` fields, and dicts of
    hashes (e.g. the task data files of a fine-tuning run)."""
    out: dict[str, str] = {}
    for key in ("inputs", "outputs"):
        for path, digest in (record.get(key) or {}).items():
            if _is_sha256(digest):
                out[f"{key[:-1]} {path}"] = digest
    for key, value in record.items():
        if key in ("inputs", "outputs", "params_hash", "upstream", "pretrain", "params", "code", "dvc_lock"):
            continue  # code hashes change with an edit that changes no output: never shown
        if _is_sha256(value):
            out[key] = value
        elif isinstance(value, dict) and value and all(_is_sha256(v) for v in value.values()):
            for sub, digest in value.items():
                out[f"{key} {sub}"] = digest
    return out


def _entry(name: str, rec: dict[str, Any], source: str) -> dict[str, Any]:
    """A stage of the chain: what its record says about data and params only, never a commit, time or
    run id (an older checkpoint's records carry them)."""
    return {"stage": name, "params_hash": rec.get("params_hash"), "hashes": _hashes(rec), "source": source}


def provenance_chain(
    record: dict[str, Any] | None, stage: str = "finetune", records: dict[str, dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """The stages behind a checkpoint, downstream first (finetune → pretrain → … → download).

    Each entry: ``{stage, params_hash, hashes {what: sha256}, source}``: data and params only, so
    the chain a checkpoint embeds always renders the same. The chain is what ``record`` embeds
    (``source`` = "checkpoint"). ``records``
    (e.g. the files in ``data/provenance/``) may complete it, but a record is only added when
    one of its output hashes appears among the chain's hashes, i.e. when it provably produced
    something the chain consumed (``source`` = "linked by <what>"). A stage that appears more
    than once is listed from its first (most downstream) occurrence.
    """
    seen: dict[str, dict[str, Any]] = {}
    for name, rec in iter_records(record or {}, stage):
        seen.setdefault(name, _entry(name, rec, "checkpoint"))
    pending = dict(records or {})
    while seen and pending:
        known = {d: what for e in seen.values() for what, d in e["hashes"].items() if not what.startswith("output ")}
        linked = None
        for name, rec in pending.items():
            if name in seen or not isinstance(rec, dict):
                continue
            outputs = {d for d in (rec.get("outputs") or {}).values() if _is_sha256(d)}
            match = sorted(outputs & set(known))
            if match:
                linked = name
                for sub_name, sub in iter_records(rec, name):
                    seen.setdefault(sub_name, _entry(sub_name, sub, f"linked by {known[match[0]]}"))
                break
        if linked is None:
            break
        pending.pop(linked)
    order = {s: i for i, s in enumerate(STAGE_ORDER)}
    return sorted(seen.values(), key=lambda e: order.get(e["stage"], len(order)))
