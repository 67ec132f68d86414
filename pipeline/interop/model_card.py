"""The model card (Hugging Face ``README.md``) of a ``bertrace export --hf`` directory.

Front matter as the Hub reads it (``library_name``, ``pipeline_tag``, ``tags``, ``datasets``),
then what the export's ``bertrace_export.json`` and the checkpoint's provenance say: the data
(pre-training corpus and task data), the recipe (architecture, pre-training objective and budget,
fine-tuning params), the metrics with the seed that made them, the provenance (source checkpoint's
sha256, and the signed attestation's sha256 once ``bertrace attest`` has run), and the limits.
Written by the export; ``bertrace attest DIR`` then fills in its attestation line (the card is not
an attested subject: it names the attestation).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from pipeline.core.io import atomic_open
from pipeline.lineage.provenance import iter_records
from pipeline.lineage.trace import corpus_source, imported_source

CARD = "README.md"
_PIPELINE_TAGS = {
    "classification": "text-classification",
    "token_classification": "token-classification",
    "regression": "text-classification",
}
_TINY_HIDDEN = 256  # below this a model is the CPU demo size, not a usable BERT


def _records(provenance: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """``{stage: record}`` of the chain (the most downstream copy of each)."""
    out: dict[str, dict[str, Any]] = {}
    for name, rec in iter_records(provenance or {}, (provenance or {}).get("stage")):
        out.setdefault(str(name), rec)
    return out


def _corpus(records: dict[str, dict[str, Any]]) -> str:
    """Where the pre-training text came from, as ``bertrace trace`` says it."""
    source = corpus_source(records["download"]) if "download" in records else None
    if source:
        return f"`{source}`"
    if "imported" in records:
        return f"the published checkpoint `{imported_source(records['imported'])}` (imported, not pre-trained here)"
    return "not recorded"


def _attestation_line(sha256: str | None) -> str:
    if sha256:
        return (
            f"- Attestation: `attestation.intoto.json`, sha256 `{sha256}` (in-toto / SLSA provenance, signed; "
            "`bertrace verify-attestation <this directory> --key <public key>`)."
        )
    return "- Attestation: none yet (`bertrace attest <this directory> --key <private key>`)."


def render(info: dict[str, Any], checkpoint: dict[str, Any], attestation_sha256: str | None = None) -> str:
    """The card's text from an export's ``info`` (``bertrace_export.json``) and its checkpoint."""
    records = _records(info.get("provenance"))
    task = info.get("task") or {}
    source = task.get("source") or {}
    task_data = source.get("dataset") or source.get("path") or None
    config = checkpoint.get("model_config") or {}
    metrics = checkpoint.get("metrics") or {}
    front = {
        "library_name": "transformers",
        "pipeline_tag": _PIPELINE_TAGS.get(task.get("type") or "", "fill-mask")
        if info.get("kind") == "classifier"
        else "fill-mask",
        "tags": ["bertrace", str(checkpoint.get("architecture") or "bert")],
    }
    if task_data and source.get("type") == "hub":
        front["datasets"] = [task_data]
    pretrain = (records.get("pretrain") or {}).get("params") or {}
    finetune = (records.get("finetune") or {}).get("params") or {}
    tokenizer = (records.get("tokenizer") or {}).get("params") or {}
    lines = [
        "---",
        yaml.safe_dump(front, sort_keys=False).strip(),
        "---",
        "",
        f"# {info.get('architecture')} trained with bertrace",
        "",
        "Pre-trained from scratch and fine-tuned by the bertrace DVC pipeline (BERT as Devlin et al. 2019 "
        "and Google's released code describe it); every file here traces back to its data, code and params.",
        "",
        "## Data",
        f"- Pre-training corpus: {_corpus(records)}; WordPiece vocabulary of {config.get('vocab_size')} pieces"
        + (f" (lowercase: {tokenizer.get('lowercase')})" if tokenizer else ""),
    ]
    if task:
        lines.append(f"- Task: {task.get('type')} on {f'`{task_data}`' if task_data else 'not recorded'}")
    lines += [
        "",
        "## Recipe",
        f"- Model: {config.get('num_layers')} layers, hidden {config.get('hidden_size')}, "
        f"{config.get('num_heads')} heads, intermediate {config.get('intermediate_size')}",
    ]
    if pretrain:
        lines.append(f"- Pre-training: `{json.dumps(_brief(pretrain), sort_keys=True)}`")
    if finetune:
        lines.append(f"- Fine-tuning: `{json.dumps(_brief(finetune), sort_keys=True)}`")
    lines += ["", "## Metrics", ""]
    if metrics:
        lines += ["| metric | value |", "|---|---:|"]
        lines += [f"| {k} | {v:.4f} |" for k, v in sorted(metrics.items()) if isinstance(v, (int, float))]
        lines.append("")
        lines.append(f"On the task's validation split; this checkpoint's seed: {checkpoint.get('seed')}.")
    else:
        lines.append("None recorded in the checkpoint.")
    lines += [
        "",
        "## Provenance",
        f"- Exported from `{info.get('source_checkpoint')}`, sha256 `{info.get('source_sha256')}`; its full "
        "chain is in `bertrace_export.json` (`bertrace trace <this directory> --verify`).",
        _attestation_line(attestation_sha256),
        "",
        "## Limits",
    ]
    if (config.get("hidden_size") or 0) < _TINY_HIDDEN:
        lines.append(
            f"- A demonstration-size model (hidden size {config.get('hidden_size')}) trained on a CPU in "
            "minutes: it shows the pipeline, it is not a usable BERT."
        )
    lines.append("- Evaluated only on the metrics above; not checked for bias or for other domains or languages.")
    return "\n".join(lines) + "\n"


def _brief(params: dict[str, Any]) -> dict[str, Any]:
    """A stage's scalar params (nested sections left to bertrace_export.json)."""
    return {k: v for k, v in params.items() if isinstance(v, (str, int, float, bool)) or v is None}


def write_card(directory: Path, info: dict[str, Any], checkpoint: dict[str, Any]) -> Path:
    path = Path(directory) / CARD
    with atomic_open(path) as f:
        f.write(render(info, checkpoint))
    return path


def note_attestation(directory: Path, sha256: str) -> Path | None:
    """Name the attestation in the card of ``directory`` (its "- Attestation:" line); None when the
    directory has no bertrace card."""
    path = Path(directory) / CARD
    if not path.is_file():
        return None
    lines = path.read_text(encoding="utf-8").split("\n")
    at = [i for i, line in enumerate(lines) if line.startswith("- Attestation:")]
    if not at:
        return None
    lines[at[0]] = _attestation_line(sha256)
    with atomic_open(path) as f:
        f.write("\n".join(lines))
    return path
