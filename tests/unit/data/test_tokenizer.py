"""Tokenizer stage library: WordPiece training, fixed special ids, vocab.txt, determinism, stats."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.core.errors import BertraceError
from pipeline.core.io import sha256_file
from pipeline.data.tokenizer import load_tokenizer, read_vocab
from pipeline.core.formats import SPECIAL_IDS, SPECIAL_TOKENS
from pipeline.data.tokenizer_training import corpus_alphabet, tokenizer_stats, train_wordpiece
from tests.conftest import REPO
from tests.support.corpus import WORDS, write_corpus





@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    corpus = write_corpus(d / "train.txt")
    info = train_wordpiece(corpus, d / "out", vocab_size=200, lowercase=True, min_frequency=2, progress=False)
    return corpus, d / "out", info


def test_outputs_special_ids_and_vocab_txt(trained):
    _, out, info = trained
    tok = load_tokenizer(out / "tokenizer.json")
    assert {t: tok.token_to_id(t) for t in SPECIAL_TOKENS} == {
        "[PAD]": 0,
        "[UNK]": 1,
        "[CLS]": 2,
        "[SEP]": 3,
        "[MASK]": 4,
    }
    vocab = read_vocab(out / "vocab.txt")
    assert vocab[:5] == list(SPECIAL_TOKENS)
    # vocab.txt is the tokenizer's vocabulary in id order, no gaps, no duplicates
    assert vocab == [tok.id_to_token(i) for i in range(tok.get_vocab_size())]
    assert len(set(vocab)) == len(vocab) == info["vocab_size"] == tok.get_vocab_size() == 200
    assert all(t and t.strip() == t for t in vocab)
    assert info["tokenizer_sha256"] == sha256_file(out / "tokenizer.json")
    assert info["vocab_sha256"] == sha256_file(out / "vocab.txt")
    assert any(t.startswith("##") for t in vocab) and "quick" in vocab
    # only the five real special tokens are "added" (special) tokens
    added = json.loads((out / "tokenizer.json").read_text())["added_tokens"]
    assert [(a["id"], a["content"], a["special"]) for a in added] == [
        (i, t, True) for i, t in enumerate(SPECIAL_TOKENS)
    ]


def test_round_trip_template_and_normalisation(trained):
    _, out, _ = trained
    tok = load_tokenizer(out)  # a directory works too
    text = "the quick brown fox jumps over the lazy dog, 1234."
    enc = tok.encode(text)
    assert enc.ids[0] == SPECIAL_IDS["[CLS]"] and enc.ids[-1] == SPECIAL_IDS["[SEP]"]
    assert SPECIAL_IDS["[UNK]"] not in enc.ids
    assert tok.decode(enc.ids) == text
    # uncased: lowercased and accents stripped, as Google's uncased BERT
    assert tok.encode("THE Quick CAFÉ").tokens == tok.encode("the quick cafe").tokens
    pair = tok.encode("the fox", "the dog")
    assert pair.tokens == ["[CLS]", "the", "fox", "[SEP]", "the", "dog", "[SEP]"]
    assert pair.type_ids == [0, 0, 0, 0, 1, 1, 1]
    # a word split into pieces uses the ## continuation prefix and decodes back whole
    pieces = tok.encode("boxerswizards", add_special_tokens=False).tokens
    assert len(pieces) > 1 and all(p.startswith("##") for p in pieces[1:])
    assert tok.decode(tok.encode("boxerswizards").ids) == "boxerswizards"
    # WordPiece: a word with a piece not in the vocabulary ("##q" never occurs) is [UNK] as a whole
    assert tok.encode("wizardsquietly", add_special_tokens=False).tokens == ["[UNK]"]


def test_training_is_deterministic(tmp_path, trained):
    corpus, out, info = trained
    again = train_wordpiece(corpus, tmp_path / "again", vocab_size=200, lowercase=True, min_frequency=2, progress=False)
    assert again == info
    assert (tmp_path / "again" / "tokenizer.json").read_bytes() == (out / "tokenizer.json").read_bytes()


def test_training_is_deterministic_across_processes(tmp_path):
    """Hash seeds differ per process; tokenizers' own WordPieceTrainer gives different vocabularies
    run to run (huggingface/tokenizers#1794; on this very corpus 8 runs gave 8 different
    tokenizer.json files). Ours must not."""
    corpus = write_corpus(tmp_path / "train.txt", n_docs=400, seed=3)
    script = (
        "import sys; from pathlib import Path; from pipeline.data.tokenizer_training import train_wordpiece\n"
        "print(train_wordpiece(Path(sys.argv[1]), Path(sys.argv[2]), vocab_size=300, lowercase=True,"
        " min_frequency=2, progress=False)['tokenizer_sha256'])\n"
    )
    shas = {
        subprocess.run(
            [sys.executable, "-c", script, str(corpus), str(tmp_path / f"o{i}")],
            cwd=REPO,
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout.strip()
        for i in range(3)
    }
    assert len(shas) == 1


def test_cased_tokenizer_keeps_case_and_accents(tmp_path):
    corpus = write_corpus(tmp_path / "train.txt", n_docs=100)
    train_wordpiece(corpus, tmp_path / "out", vocab_size=300, lowercase=False, min_frequency=2, progress=False)
    tok = load_tokenizer(tmp_path / "out")
    assert tok.decode(tok.encode("Café Ångström").ids) == "Café Ångström"
    assert "Café" in tok.get_vocab() or "C" in tok.get_vocab()


def test_limit_alphabet_and_small_corpus_vocab(tmp_path):
    corpus = tmp_path / "train.txt"
    corpus.write_text("aaa bbb ccc\n" * 5 + "zzz ☃\n", encoding="utf-8")
    assert corpus_alphabet(corpus, lowercase=True, limit=None) == ["a", "b", "c", "z", "☃"]
    assert corpus_alphabet(corpus, lowercase=True, limit=3) == ["a", "b", "c"]
    info = train_wordpiece(
        corpus, tmp_path / "out", vocab_size=1000, lowercase=True, min_frequency=1, limit_alphabet=3, progress=False
    )
    vocab = read_vocab(tmp_path / "out" / "vocab.txt")
    assert info["vocab_size"] == len(vocab) < 1000  # the corpus has fewer pieces than requested
    assert sorted(t for t in vocab[5:] if len(t) == 1) == ["a", "b", "c"]
    assert "z" not in vocab and "☃" not in vocab
    assert {"aaa", "bbb", "ccc"} <= set(vocab)


def test_corpus_alphabet_counts_normalised_characters(tmp_path):
    corpus = tmp_path / "t.txt"
    corpus.write_text("ÉÉÉÉ eee x\n", encoding="utf-8")
    assert corpus_alphabet(corpus, lowercase=True, limit=1) == ["e"]  # uncased: É → e, 7 of them
    assert corpus_alphabet(corpus, lowercase=False, limit=1) == ["É"]  # cased: 4 É beat 3 e
    corpus.write_text("bbb aaa\n", encoding="utf-8")
    assert corpus_alphabet(corpus, lowercase=True, limit=1) == ["a"]  # a tie: the lower code point wins


def test_stats_on_crafted_corpus(tmp_path):
    corpus = tmp_path / "train.txt"
    corpus.write_text("aaa bbb, ccc.\n" * 10, encoding="utf-8")
    train_wordpiece(corpus, tmp_path / "out", vocab_size=100, lowercase=True, min_frequency=1, progress=False)
    valid = tmp_path / "valid.txt"
    valid.write_text("aaa bbb ☃\naaa, bbb\nccc ccc ccc ccc\n", encoding="utf-8")
    stats = tokenizer_stats(tmp_path / "out" / "tokenizer.json", valid)
    # tokens: [aaa bbb UNK] [aaa , bbb] [ccc ccc ccc ccc] = 3 + 3 + 4; words 3 + 2 + 4
    assert stats == {
        "documents": 3,
        "tokens": 10,
        "words": 9,
        "unk_rate": pytest.approx(1 / 10),
        "tokens_per_word": pytest.approx(10 / 9),
    }
    first = tokenizer_stats(tmp_path / "out" / "tokenizer.json", valid, max_docs=1)
    assert first == {
        "documents": 1,
        "tokens": 3,
        "words": 3,
        "unk_rate": pytest.approx(1 / 3),
        "tokens_per_word": pytest.approx(1.0),
    }
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    assert tokenizer_stats(tmp_path / "out" / "tokenizer.json", empty)["documents"] == 0


def test_matches_transformers_bert_tokenizer_built_from_vocab_txt(trained):
    """vocab.txt alone, read by transformers' BertTokenizer, encodes like our tokenizer.json."""
    transformers = pytest.importorskip("transformers")
    _, out, _ = trained
    vocab = {t: i for i, t in enumerate(read_vocab(out / "vocab.txt"))}
    ref = transformers.BertTokenizer(vocab=vocab, do_lower_case=True)
    ours = load_tokenizer(out)
    for a, b in [("The QUICK brown fox, jumps!", "Café Ångström 42."), ("wizardsquietly ☃ 中文", "x")]:
        assert ref(a, b)["input_ids"] == ours.encode(a, b).ids


# -- errors -------------------------------------------------------------------------------------
def test_load_tokenizer_errors(tmp_path, trained):
    with pytest.raises(BertraceError, match=r"missing\.json: tokenizer not found; run the tokenizer stage"):
        load_tokenizer(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": "1.0", "model": ', encoding="utf-8")
    with pytest.raises(BertraceError, match=r"bad\.json: not a valid tokenizer file.*rerun the tokenizer stage"):
        load_tokenizer(bad)

    # a valid tokenizer whose special tokens sit at other ids
    from tokenizers import Tokenizer, models

    other = Tokenizer(
        models.WordPiece({"[UNK]": 0, "[PAD]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4, "a": 5}, unk_token="[UNK]")
    )
    other.save(str(tmp_path / "other.json"))
    with pytest.raises(
        BertraceError,
        match=r"other\.json: special tokens have ids \{'\[PAD\]': 1, '\[UNK\]': 0\}"
        r".*rerun the tokenizer stage",
    ):
        load_tokenizer(tmp_path / "other.json")


def test_train_errors(tmp_path):
    with pytest.raises(BertraceError, match=r"train\.txt: not found; run the clean stage"):
        train_wordpiece(
            tmp_path / "train.txt", tmp_path / "out", vocab_size=100, lowercase=True, min_frequency=2, progress=False
        )
    (tmp_path / "train.txt").write_text("", encoding="utf-8")
    with pytest.raises(BertraceError, match=r"train\.txt: empty"):
        train_wordpiece(
            tmp_path / "train.txt", tmp_path / "out", vocab_size=100, lowercase=True, min_frequency=2, progress=False
        )
    (tmp_path / "train.txt").write_text("some text\n", encoding="utf-8")
    with pytest.raises(BertraceError, match=r"vocab_size=5 is too small"):
        train_wordpiece(
            tmp_path / "train.txt", tmp_path / "out", vocab_size=5, lowercase=True, min_frequency=2, progress=False
        )
    assert not (tmp_path / "out").exists()


# -- bounded memory on long documents (BENCHMARKS.md "Scaling") --------------------------------------
def test_line_batches_are_bounded_by_characters(tmp_path, monkeypatch):
    import pipeline.data.tokenizer as T

    monkeypatch.setattr(T, "BATCH_CHARS", 1000)
    path = tmp_path / "train.txt"
    lines = ["x" * 300] * 10 + ["y" * 5000, "z"]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    batches = list(T.line_batches(path))
    assert [line for b in batches for line in b] == lines  # every line, in order, once
    assert [len(b) for b in batches] == [4, 4, 3, 1]  # a batch ends at the line that reaches 1000 chars


def test_pieces_cut_only_at_spaces_and_bound_length():
    from pipeline.data.tokenizer_training import _pieces

    line = " ".join(["word"] * 50 + ["x" * 40] + ["a,b.c"] * 30)
    batch = [line, "short one", "y" * 100 + " tail", ""]
    (out,) = list(_pieces(iter([batch]), max_chars=30))
    assert " ".join(out[:-4]) == line and out[-4:] == ["short one", "y" * 100, "tail", ""]
    assert all(len(p) <= 30 or " " not in p for p in out)
    assert max(map(len, out[:-4])) == 40 and len(out) >= 20


def test_cutting_documents_for_the_trainer_changes_no_token(tmp_path):
    """The trainer gets documents cut at spaces (bounded memory); the tokenizer must be the one the
    whole documents give: same vocabulary, same ids, same bytes."""
    from pipeline.data.tokenizer import line_batches
    from pipeline.data.tokenizer_training import _pieces, _train, continuation_pieces

    rng = random.Random(1)
    extra = ["naïve", "Ωμέγα", "ΣΟΦΟΣ", "東京都", "e\u0301t\u00e9", "x-ray", "(a)", "U.S.", "don't"]
    docs = [" ".join(rng.choice(WORDS + extra) for _ in range(rng.randint(300, 900))) for _ in range(40)]
    path = tmp_path / "train.txt"
    path.write_text("\n".join(docs) + "\n", encoding="utf-8")
    alphabet = corpus_alphabet(path, lowercase=True, limit=1000)
    pinned = continuation_pieces(path, lowercase=True, alphabet=alphabet)
    whole = _train(line_batches(path), None, True, 300, 2, alphabet, pinned, False)
    for max_chars in (7, 64):
        cut = _train(_pieces(line_batches(path), max_chars), None, True, 300, 2, alphabet, pinned, False)
        assert cut.to_str() == whole.to_str()


@pytest.mark.parametrize("lowercase, strip_accents", [(True, "auto"), (True, True), (False, False)])
def test_continuation_pieces_are_the_ones_a_no_merge_training_pass_creates(tmp_path, lowercase, strip_accents):
    """Unicode stress text (combining marks, controls, CJK, emoji, Bengali signs newer than the
    pre-tokeniser's tables, İ that lowercases to two characters, zero-width and other spaces): the
    vectorised pair reading finds exactly the ##x pieces the trainer itself makes."""
    from pipeline.data.tokenizer import line_batches
    from pipeline.data.tokenizer_training import _train, continuation_pieces

    rng = np.random.default_rng(7)
    ranges = [(0x20, 0x7F), (0x80, 0x250), (0x300, 0x370), (0x980, 0xA00), (0x4E00, 0x4E40), (0x1F600, 0x1F640)]
    ranges += [(0x2000, 0x2070), (0x1, 0x20), (0xFB00, 0xFB07), (0x130, 0x132), (0x200B, 0x2010), (0x3000, 0x3010)]
    lines = []
    for _ in range(3000):
        cps = [int(rng.integers(*ranges[rng.integers(len(ranges))])) for _ in range(int(rng.integers(5, 120)))]
        lines.append("".join(chr(c) for c in cps if c not in (10, 13)))
    path = tmp_path / "stress.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    alphabet = corpus_alphabet(path, lowercase=lowercase, limit=1000, strip_accents=strip_accents)
    trained = _train(line_batches(path), None, lowercase, 0, 0, alphabet, [], False, strip_accents)
    expected = sorted(t for t in trained.get_vocab(with_added_tokens=False) if t.startswith("##") and len(t) == 3)
    got = continuation_pieces(path, lowercase=lowercase, alphabet=alphabet, strip_accents=strip_accents)
    assert len(expected) > 300 and got == expected


def test_continuation_pieces_do_not_depend_on_threads_or_batches(tmp_path, monkeypatch):
    """Read by 3 threads in 4 kB batches, a text gives the pieces one thread gives in one batch;
    a line end joins no words ("b" ends one line, "ŋ", seen nowhere else, starts the next)."""
    import pipeline.data.tokenizer as T
    from pipeline.data.tokenizer_training import continuation_pieces

    rng = random.Random(3)
    lines = [" ".join(rng.choice(WORDS + ["naïve", "Ωμέγα", "東京", "x-ray"]) for _ in range(60)) for _ in range(300)]
    lines += ["only b", "ŋ only"]
    path = tmp_path / "train.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    alphabet = corpus_alphabet(path, lowercase=True, limit=1000)
    one = continuation_pieces(path, lowercase=True, alphabet=alphabet)
    monkeypatch.setattr(T, "BATCH_CHARS", 4096)
    assert len(list(T.line_batches(path))) > 20
    assert continuation_pieces(path, lowercase=True, alphabet=alphabet, workers=3) == one
    assert "##ŋ" not in one and "ŋ" in alphabet and "##μ" in one


def test_thread_map_keeps_order_and_bounds_what_is_in_flight():
    import threading
    import time

    from pipeline.data.tokenizer_training import thread_map

    taken, lock = [], threading.Lock()

    def items():
        for i in range(40):
            with lock:
                taken.append(i)
            yield i

    seen = []
    for got in thread_map(lambda i: (time.sleep(0.001 * (i % 3)), i * i)[1], items(), workers=3):
        seen.append(got)
        with lock:
            assert len(taken) - len(seen) <= 6  # at most 2 * workers items taken but not yet returned
    assert seen == [i * i for i in range(40)]
    assert list(thread_map(str, range(5), workers=1)) == ["0", "1", "2", "3", "4"]
