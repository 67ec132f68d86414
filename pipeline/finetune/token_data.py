"""Token classification (NER) data: CoNLL files, BIO checks, word-piece label alignment, spans.

* :func:`read_conll` reads the CoNLL format: one ``token ... tag`` per line, fields separated by
  whitespace, the token first and the tag last (CoNLL-2003's ``token POS chunk NER`` works as
  well as WNUT-17's ``token<TAB>tag``); a blank (or whitespace-only) line ends a sentence;
  ``-DOCSTART-`` lines are skipped; CRLF line endings are fine. The columns it returns are named
  as the hub's CoNLL-2003 (``tokens``, ``ner_tags``), so one set of params serves both. A tag
  field holding several comma-separated tags (the WNUT-17 test file lists alternatives for 297
  tokens) is read as its first tag; the count is reported.
* :func:`encode_words` aligns word-level labels to WordPieces as BERT's paper does for CoNLL-2003
  (Devlin et al. 2019, section 5.3; Hugging Face's ``run_ner.py`` with
  ``label_all_tokens=False``): **the first sub-token of each word carries the word's label, the
  other sub-tokens and [CLS]/[SEP] get -100** (ignored by the loss and by evaluation). A
  prediction for a word is read at its first sub-token.
* :func:`check_bio` insists on the IOB2 label shape (``O``, ``B-X``, ``I-X``) and
  :func:`bio_violations` counts ``I-X`` tags that do not follow ``B-X`` / ``I-X`` (reported,
  not fixed: seqeval, like conlleval, reads them as the start of an entity).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from pipeline.core.errors import BertraceError
from pipeline.core.formats import CLS_ID, SEP_ID

IGNORE = -100  # label of positions the loss and the metrics skip
DOCSTART = "-DOCSTART-"


def read_conll(path: str | Path, stats: dict[str, Any] | None = None) -> dict[str, list]:
    """``{"tokens": [[word, ...], ...], "ner_tags": [[tag, ...], ...]}`` of a CoNLL file (see the
    module docstring). ``stats`` (if given) receives ``sentences``, ``tokens`` and
    ``multi_tags`` (tag fields with several comma-separated tags, read as the first)."""
    path = Path(path)
    if not path.is_file():
        raise BertraceError(f"{path}: file not found; fix the path in params.yaml (finetune.task.local)")
    tokens: list[list[str]] = []
    tags: list[list[str]] = []
    words: list[str] = []
    labels: list[str] = []
    multi = 0

    def flush() -> None:
        if words:
            tokens.append(list(words))
            tags.append(list(labels))
            words.clear()
            labels.clear()

    try:
        with open(path, encoding="utf-8", newline="") as f:
            for lineno, line in enumerate(f, 1):
                fields = line.split()
                if not fields:
                    flush()
                    continue
                if fields[0] == DOCSTART:
                    flush()
                    continue
                if len(fields) < 2:
                    raise BertraceError(
                        f"{path}:{lineno}: {line.strip()!r} has no tag; a CoNLL line is 'token tag' "
                        "(whitespace separated, tag last) and a blank line ends a sentence"
                    )
                tag = fields[-1]
                if "," in tag:
                    multi += 1
                    tag = tag.split(",")[0]
                words.append(fields[0])
                labels.append(tag)
    except UnicodeDecodeError as e:
        raise BertraceError(f"{path}: not valid UTF-8 ({e.reason}); convert it to UTF-8") from None
    flush()
    if stats is not None:
        stats.update(sentences=len(tokens), tokens=sum(map(len, tokens)), multi_tags=multi)
    return {"tokens": tokens, "ner_tags": tags}


# ---------------------------------------------------------------------------------------------
# BIO
# ---------------------------------------------------------------------------------------------
def check_bio(label_names: Sequence[str], where: str) -> list[str]:
    """The entity types of an IOB2 label set; BertraceError naming ``where`` when a name is not
    ``O``, ``B-X`` or ``I-X``, or an ``I-X`` has no ``B-X``."""
    bad = [n for n in label_names if n != "O" and not (n[:2] in ("B-", "I-") and len(n) > 2)]
    if bad or "O" not in label_names:
        raise BertraceError(
            f"{where}: token_classification needs BIO (IOB2) tags: 'O', 'B-TYPE', 'I-TYPE'; "
            + (f"these are not: {bad[:8]}" if bad else "there is no 'O' tag")
            + " (label sets such as BIOES or plain types must be converted to BIO first)"
        )
    begins = {n[2:] for n in label_names if n.startswith("B-")}
    orphans = sorted(n for n in label_names if n.startswith("I-") and n[2:] not in begins)
    if orphans:
        raise BertraceError(
            f"{where}: tags {orphans} have no matching B- tag; list both B-X and I-X in finetune.task.label_names"
        )
    return sorted(begins)


def bio_violations(tag_seqs: Sequence[Sequence[str]]) -> int:
    """Number of ``I-X`` tags not preceded by ``B-X`` or ``I-X`` (IOB2 violations)."""
    n = 0
    for seq in tag_seqs:
        prev = "O"
        for tag in seq:
            if tag.startswith("I-") and prev[2:] != tag[2:]:
                n += 1
            prev = tag
    return n


def entities(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """``(type, first word, last word)`` spans of an IOB2 tag sequence, read as seqeval's default
    (conlleval) mode: an ``I-X`` after ``O`` or another type starts an entity."""
    out: list[tuple[str, int, int]] = []
    start, kind = None, None
    for i, tag in enumerate(list(tags) + ["O"]):
        prefix, typ = (tag[:1], tag[2:]) if tag != "O" else ("O", None)
        continues = prefix == "I" and kind == typ and start is not None
        if start is not None and not continues:
            out.append((kind, start, i - 1))
            start, kind = None, None
        if prefix in ("B", "I") and not continues:
            start, kind = i, typ
    return out


# ---------------------------------------------------------------------------------------------
# Word-piece alignment
# ---------------------------------------------------------------------------------------------
def encode_words(
    tokenizer, words: Sequence[Sequence[str]], labels: Sequence[Sequence[int]] | None, max_len: int
) -> dict[str, Any]:
    """WordPieces of pre-split sentences with word labels aligned to them.

    Returns ``input_ids`` / ``token_type_ids`` (``[CLS] pieces [SEP]``, cut to ``max_len``),
    ``labels`` (per position: the word's label at its first sub-token, -100 elsewhere; None
    without ``labels``), ``first`` (per word: the position of its first sub-token, -1 when the
    word lost all its pieces to truncation or has none, e.g. a lone zero-width space) and
    ``truncated`` (sentences that lost words)."""
    if max_len < 3:
        raise BertraceError(f"params.yaml: finetune.max_len {max_len} is too small; it must be at least 3")
    encs = tokenizer.encode_batch([list(w) for w in words], is_pretokenized=True, add_special_tokens=False)
    all_ids, all_types, all_labels, all_first, n_cut = [], [], [], [], 0
    budget = max_len - 2
    for k, enc in enumerate(encs):
        ids = enc.ids[:budget]
        first = [-1] * len(words[k])
        for pos, w in enumerate(enc.word_ids[:budget]):
            if w is not None and first[w] < 0:
                first[w] = pos + 1  # +1: [CLS]
        n_cut += len(enc.ids) > budget
        seq = [CLS_ID, *ids, SEP_ID]
        all_ids.append(seq)
        all_types.append([0] * len(seq))
        all_first.append(first)
        if labels is not None:
            lab = [IGNORE] * len(seq)
            for w, pos in enumerate(first):
                if pos >= 0:
                    lab[pos] = int(labels[k][w])
            all_labels.append(lab)
    return {
        "input_ids": all_ids,
        "token_type_ids": all_types,
        "labels": all_labels if labels is not None else None,
        "first": all_first,
        "truncated": n_cut,
    }


def encode_text(tokenizer, text: str, max_len: int) -> dict[str, Any]:
    """Raw text for prediction: the tokenizer's own pre-tokenizer splits it into words
    (whitespace and punctuation, as CoNLL files are split), so each word keeps its character
    offsets in ``text``. Returns ``input_ids``, ``token_type_ids``, ``first`` (per word) and
    ``offsets`` (per word: ``(start, end)`` characters)."""
    enc = tokenizer.encode(text, add_special_tokens=False)
    budget = max_len - 2
    n_words = max((w for w in enc.word_ids if w is not None), default=-1) + 1
    first, offsets = [-1] * n_words, [None] * n_words
    for pos, (w, (s, e)) in enumerate(zip(enc.word_ids, enc.offsets)):
        if w is None:
            continue
        offsets[w] = (s, e) if offsets[w] is None else (offsets[w][0], e)
        if pos < budget and first[w] < 0:
            first[w] = pos + 1
    ids = [CLS_ID, *enc.ids[:budget], SEP_ID]
    return {
        "input_ids": ids,
        "token_type_ids": [0] * len(ids),
        "first": first,
        "offsets": [o if o is not None else (0, 0) for o in offsets],
    }


def word_predictions(logits_rows: Sequence[Any], first: Sequence[int], label_names: Sequence[str]) -> list[str]:
    """Word tags from one sequence's per-position logits (``[T, K]``), read at each word's first
    sub-token; a word without a position (cut by ``max_len``) is tagged ``O``."""
    return [label_names[int(logits_rows[p].argmax())] if p >= 0 else "O" for p in first]


def spans(text: str, tags: Sequence[str], offsets: Sequence[tuple[int, int]]) -> list[dict[str, Any]]:
    """Entities of a tagged text: ``[{"type", "text", "start", "end"}]`` (character offsets,
    ``text[start:end]``)."""
    out = []
    for kind, a, b in entities(tags):
        start, end = offsets[a][0], offsets[b][1]
        out.append({"type": kind, "text": text[start:end], "start": start, "end": end})
    return out


__all__ = [
    "read_conll",
    "check_bio",
    "bio_violations",
    "entities",
    "encode_words",
    "encode_text",
    "word_predictions",
    "spans",
    "IGNORE",
]
