"""What the Hugging Face exports of every model family share (:mod:`pipeline.interop.export` for BERT and
ELECTRA, :mod:`pipeline.interop.export_gpt` for GPT-2): the atomic directory writer with its
``bertrace_export.json``, the tokenizer's normaliser as transformers' config keys, and the probe
texts that check the exported tokenizer on other scripts."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from pipeline.core.errors import BertraceError
from pipeline.core.io import sha256_file, write_json
from pipeline.data.encode import bert_normalizer
from pipeline.interop.model_card import write_card

# Texts whose combining marks a normaliser may keep or strip: the export's tokenizer must agree on them.
SCRIPT_PROBES = [
    "অক্সিজেন একটি মৌল।",
    "हिन्दी भाषा",
    "Αθήνα, Ελλάδα",
    "Tiếng Việt có dấu",
    "中文测试",
    "がギ 한국어",
    "مُحَمَّد",
    "ที่นี่",
]
EXPORT_INFO = "bertrace_export.json"


def hf_normalizer_config(tokenizer_json: str | Path) -> dict[str, bool]:
    """``do_lower_case`` / ``strip_accents`` / ``tokenize_chinese_chars`` of a BERT tokenizer.json
    (for the script-aware normaliser: those of its ``BertNormalizer`` step, which strips nothing)."""
    data = json.loads(Path(tokenizer_json).read_text(encoding="utf-8"))
    norm = bert_normalizer(data.get("normalizer") or {})
    if norm is None:
        raise BertraceError(
            f"{tokenizer_json}: normalizer is {(data.get('normalizer') or {}).get('type')!r}, not "
            "BERT's; only BERT tokenizers (the tokenizer stage's) can be exported"
        )
    lower = bool(norm.get("lowercase", True))
    strip = norm.get("strip_accents")
    return {
        "do_lower_case": lower,
        "strip_accents": lower if strip is None else bool(strip),
        "tokenize_chinese_chars": bool(norm.get("handle_chinese_chars", True)),
    }


def write_export(
    tf,
    hf_model,
    hf_cls,
    loaded: dict[str, Any],
    src: Path,
    out_dir: Path,
    kind: str,
    verify: bool,
    *,
    write_tokenizer,
    verify_fn,
) -> dict[str, Any]:
    """Write ``out_dir`` atomically (a temp directory renamed into place): ``hf_model``'s
    ``save_pretrained`` files, the tokenizer files (``write_tokenizer(dir)``) and
    ``bertrace_export.json`` (source, hashes, provenance, and ``verify_fn``'s logits check when
    ``verify``) and the model card ``README.md`` (:mod:`pipeline.interop.model_card`). Shared by the BERT/ELECTRA export (pipeline/interop/export.py) and the GPT-2 one (pipeline/interop/export_gpt.py)."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        hf_model.save_pretrained(tmp)
        write_tokenizer(tmp)
        info: dict[str, Any] = {
            "kind": kind,
            "architecture": hf_cls.__name__,
            "source_checkpoint": str(src),
            "source_sha256": sha256_file(src),
            "tokenizer_sha256": loaded["tokenizer_sha256"],
            "label_names": loaded["label_names"],
            "task": loaded["checkpoint"].get("task"),
            "transformers_version": tf.__version__,
            "provenance": loaded["checkpoint"].get("provenance"),
        }
        if kind == "classifier" and loaded["truncation"] != "head":
            info["note"] = (
                f"fine-tuned with {loaded['truncation']} truncation to {loaded['max_len']} tokens; "
                "the HF tokenizer truncates the head only"
            )
        if verify:
            info["verification"] = verify_fn(loaded, tf, hf_cls, tmp)
        write_json(tmp / EXPORT_INFO, info)
        write_card(tmp, info, loaded["checkpoint"])
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {
        **{k: v for k, v in info.items() if k != "provenance"},
        "path": str(out_dir),
        "files": sorted(p.name for p in out_dir.iterdir()),
    }
