"""``bertrace predict`` and ``bertrace export``: the fine-tuned model outside the pipeline.

bertrace predict "a gripping film" "dull"    one JSON line per text on stdout
bertrace predict --file reviews.txt          one JSON line per input line ("-" = stdin);
                                             sentence-pair models: "text_a<TAB>text_b" lines
    classification: {text, label, label_id, probabilities}; regression: {text, score};
    token classification (NER): {text, entities: [{type, text, start, end}]} (character offsets)
bertrace export --hf DIR                     Hugging Face directory (model + tokenizer) of
    [--checkpoint data/finetune/model.pt]    a fine-tuned model.pt or a pre-training best.pt
    [--tokenizer PATH]                       (pre-training: default data/tokenizer/tokenizer.json)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Iterator

from pipeline.core.errors import BertraceError

DEFAULT_MODEL = Path("data/finetune/model.pt")
CHUNK = 4096  # lines classified (and printed) at a time with --file


def _predict_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bertrace predict",
        description="classify texts with a fine-tuned model; "
        "prints one JSON object per text: {text, label, label_id, probabilities}",
    )
    p.add_argument("texts", nargs="*", help="texts to classify (sentence-pair models: 'text_a<TAB>text_b')")
    p.add_argument("--file", "-f", help="read one text per line from this file ('-' = stdin)")
    p.add_argument(
        "--model", "-m", type=Path, default=DEFAULT_MODEL, help=f"fine-tuned checkpoint (default {DEFAULT_MODEL})"
    )
    p.add_argument("--batch-size", type=int, default=64)
    return p


def _lines(file: str) -> Iterator[str]:
    if file == "-":
        yield from (line.rstrip("\r\n") for line in sys.stdin)
        return
    path = Path(file)
    if not path.is_file():
        raise BertraceError(f"{path}: file not found; give a text file with one text per line")
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                yield line.rstrip("\r\n")
    except UnicodeDecodeError as e:
        raise BertraceError(f"{path}: not valid UTF-8 ({e.reason}); convert it to UTF-8") from None


def _chunks(items: Iterator[str], n: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= n:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def main_predict(argv: list[str] | None = None) -> None:
    args = _predict_parser().parse_args(argv)
    if bool(args.texts) == bool(args.file):
        raise BertraceError("bertrace predict: give texts as arguments or --file FILE (one of the two)")
    from pipeline.evaluate.inference import Classifier

    clf = Classifier.load(args.model)
    source = _chunks(iter(args.texts), CHUNK) if args.texts else _chunks(_lines(args.file), CHUNK)
    out = sys.stdout
    for chunk in source:
        if clf.is_pair:
            bad = [i for i, t in enumerate(chunk) if t.count("\t") != 1]
            if bad:
                raise BertraceError(
                    f"the model classifies sentence pairs ({' + '.join(clf.text_columns)}); "
                    f"write each input as 'text_a<TAB>text_b' ({len(bad)} inputs are not)"
                )
            inputs = [tuple(t.split("\t")) for t in chunk]
        else:
            inputs = chunk
        for text, pred in zip(inputs, clf.predict(inputs, batch_size=args.batch_size)):
            pred = clf.task.cli_prediction(pred)  # NER: the spans only, {type, text, start, end} (characters)
            out.write(json.dumps({"text": list(text) if clf.is_pair else text, **pred}, ensure_ascii=False) + "\n")
        out.flush()


def _export_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bertrace export", description="export a checkpoint for use outside bertrace")
    p.add_argument(
        "--hf",
        type=Path,
        required=True,
        metavar="DIR",
        help="write a Hugging Face transformers directory (config, weights, tokenizer) here",
    )
    p.add_argument(
        "--checkpoint",
        type=Path,
        default=DEFAULT_MODEL,
        help=f"fine-tuned model.pt or pre-training best.pt / last.pt (default {DEFAULT_MODEL})",
    )
    p.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        help="tokenizer.json (default: next to the checkpoint, else data/tokenizer/tokenizer.json)",
    )
    p.add_argument(
        "--no-verify",
        action="store_true",
        help="skip loading the export back with transformers to compare tokens and logits",
    )
    return p


def main_export(argv: list[str] | None = None) -> None:
    args = _export_parser().parse_args(argv)
    from pipeline.interop.export import export_hf

    info = export_hf(args.checkpoint, args.hf, tokenizer_path=args.tokenizer, verify=not args.no_verify)
    check = info.get("verification")
    checked = (
        (
            f"; checked with transformers {info['transformers_version']}: same token ids, max |logit diff| "
            f"{check['max_abs_logit_diff']:.2g}"
        )
        if check
        else ""
    )
    print(
        f"export: {info['architecture']} from {args.checkpoint} -> {info['path']} ({', '.join(info['files'])}){checked}"
    )
