"""Another language: normalisation that is right per script, one document per file, and a
Bengali-like corpus run through download → clean → tokenizer → examples → validate → pretrain
by params alone, with MLflow on.

The corpus is made here (no Bengali data in ../shared/data): real Bengali words, with conjuncts
(virama), nuktas and vowel signs, in articles of several blank-line separated paragraphs, one
article per file named by its title (Bengali, spaces, parentheses), as a Wikipedia dump
exported one article per file would be.
"""

from __future__ import annotations

import json
import random
import shutil
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import yaml

from pipeline.core.errors import BertraceError
from pipeline.data.tokenizer import (
    build_normalizer,
    build_tokenizer,
    load_tokenizer,
    normalizer_report,
    normalizer_settings,
)
from pipeline.data.tokenizer_training import train_wordpiece
from tests.conftest import REPO

# ---------------------------------------------------------------------------------------------
# Text in several scripts

BENGALI_WORDS = (
    "অক্সিজেন হাইড্রোজেন কার্বন নাইট্রোজেন পৃথিবী বায়ুমণ্ডল রাসায়নিক মৌল পারমাণবিক সংখ্যা প্রতীক গ্যাস জল "
    "শ্বাসপ্রশ্বাস প্রাণী উদ্ভিদ সালোকসংশ্লেষণ বিজ্ঞানী আবিষ্কার শতাব্দী ইতিহাস ভাষা বাংলা সাহিত্য কবি "
    "রবীন্দ্রনাথ ঠাকুর নদী পদ্মা গঙ্গা শহর কলকাতা ঢাকা রাজধানী দেশ স্বাধীনতা যুদ্ধ সরকার বিশ্ববিদ্যালয় "
    "ছাত্র শিক্ষক গবেষণা পদার্থ তাপমাত্রা চাপ তরল কঠিন বৈশিষ্ট্য ব্যবহার শিল্প কারখানা চিকিৎসা হাসপাতাল "
    "রোগ ওষুধ খাদ্য কৃষি ধান চাল মাছ বৃষ্টি বর্ষা গ্রীষ্ম শীত পাহাড় সমুদ্র বঙ্গোপসাগর দ্বীপ জঙ্গল "
    "সুন্দরবন বাঘ হরিণ পাখি একটি এবং কিন্তু তবে হয় করে ছিল আছে থেকে জন্য সঙ্গে মধ্যে প্রথম দ্বিতীয় বড় "
    "ছোট নতুন পুরনো গুরুত্বপূর্ণ"
).split()
TITLES = [
    "অক্সিজেন",
    "হাইড্রোজেন (মৌল)",
    "কলকাতা শহর",
    "পদ্মা_নদী",
    "রবীন্দ্রনাথ ঠাকুর",
    "সুন্দরবন",
    "বঙ্গোপসাগর",
    "সালোকসংশ্লেষণ",
    "বাংলা ভাষা",
    "ঢাকা বিশ্ববিদ্যালয়",
]
SAMPLES = {  # one or two sentences per script, NFC
    "bengali": "অক্সিজেন একটি রাসায়নিক মৌল। পৃথিবীর বায়ুমণ্ডলে অক্সিজেন দ্বিতীয় সর্বাধিক গ্যাস।",
    "hindi": "हिन्दी भारत की राजभाषा है। ऑक्सीजन एक रासायनिक तत्व है।",
    "greek": "Η Αθήνα είναι η πρωτεύουσα της Ελλάδας.",
    "vietnamese": "Tiếng Việt là ngôn ngữ chính thức của Việt Nam.",
    "chinese": "氧是一种化学元素，符号为O。",
    "thai": "ภาษาไทยเป็นภาษาราชการของประเทศไทย ที่นี่",
    "arabic": "الأُكْسِجِين عُنْصُر كِيمِيَائِيّ.",
}


def bengali_article(rng: random.Random, title: str) -> str:
    paragraphs = []
    for _ in range(rng.randint(4, 7)):
        sentences = []
        for _ in range(rng.randint(2, 4)):
            words = [rng.choice(BENGALI_WORDS) for _ in range(rng.randint(6, 12))]
            if rng.random() < 0.5:
                words.insert(0, title.split()[0].strip("()_").split("_")[0])
            sentences.append(" ".join(words) + "।")
        paragraphs.append(" ".join(sentences))
    return "\n\n".join(paragraphs) + "\n"


def write_bengali_corpus(root: Path, n_files: int = 48, seed: int = 0) -> list[Path]:
    """One article per file, named by a Bengali title (some with spaces, parentheses, '_')."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    files = []
    for i in range(n_files):
        title = TITLES[i % len(TITLES)] + ("" if i < len(TITLES) else f" {i // len(TITLES)}")
        path = root / f"{title}.txt"
        path.write_text(bengali_article(rng, title), encoding="utf-8")
        files.append(path)
    return files


# ---------------------------------------------------------------------------------------------
# Normalisation per script


@pytest.mark.parametrize("script", sorted(SAMPLES))
def test_auto_keeps_every_script_whose_marks_are_letters(script):
    """strip_accents: auto lowercases, and strips accents only in Latin, Greek and Cyrillic (as
    BERT uncased); false keeps every mark; true is Google's uncased rule."""
    text = SAMPLES[script]
    auto = build_normalizer(lowercase=True, strip_accents="auto").normalize_str(text)
    keep = build_normalizer(lowercase=True, strip_accents=False).normalize_str(text)
    google = build_normalizer(lowercase=True, strip_accents=True).normalize_str(text)
    squash = lambda s: unicodedata.normalize("NFC", "".join(s.split()))  # noqa: E731 - CJK gets spaces around it
    assert squash(keep) == squash(text.lower())
    if script in ("greek", "vietnamese"):  # the accents of Latin/Greek go, as in BERT uncased
        assert squash(auto) == squash(google) != squash(text.lower())
    else:  # letters of the other scripts stay
        assert squash(auto) == squash(text.lower())
    if script in ("bengali", "hindi", "thai", "arabic"):
        assert squash(google) != squash(text)  # what uncased BERT damages


@pytest.mark.parametrize("script", sorted(SAMPLES))
@pytest.mark.parametrize("strip_accents", ["auto", False])
def test_tokenizer_round_trips_each_script(tmp_path, script, strip_accents):
    """A tokenizer trained on a script encodes its text without [UNK] and decodes it back to the
    normalised text (no character lost; the decoder puts spaces around punctuation and CJK)."""
    text = SAMPLES[script]
    corpus = tmp_path / "train.txt"
    corpus.write_text("\n".join([text] * 20) + "\n", encoding="utf-8")
    train_wordpiece(
        corpus,
        tmp_path / "tok",
        vocab_size=400,
        lowercase=True,
        min_frequency=1,
        strip_accents=strip_accents,
        progress=False,
    )
    tok = load_tokenizer(tmp_path / "tok")
    enc = tok.encode(text, add_special_tokens=False)
    assert "[UNK]" not in enc.tokens
    normalised = tok.normalizer.normalize_str(text)
    assert "".join(tok.decode(enc.ids).split()) == "".join(normalised.split())
    if strip_accents is False or script not in ("greek", "vietnamese"):
        assert "".join(normalised.split()) == unicodedata.normalize("NFC", "".join(text.lower().split()))
    assert normalizer_settings(tok)["strip_accents"] == strip_accents


def test_normalizer_report_measures_the_damage(tmp_path):
    bengali = tmp_path / "bn.txt"
    write_bengali_corpus(tmp_path / "src", n_files=10)
    bengali.write_text(
        "".join(" ".join(p.read_text(encoding="utf-8").split()) + "\n" for p in sorted((tmp_path / "src").iterdir())),
        encoding="utf-8",
    )
    google = normalizer_report(build_tokenizer(lowercase=True, strip_accents=True), bengali, words_file=bengali)
    assert google["chars_altered"] > 0.10 and google["words_altered"] > 0.4  # the 12 % / 53 %
    assert google["top"][0]["name"] == "BENGALI SIGN VIRAMA" and google["top"][0]["becomes"] == ""
    assert "→" in google["example"]
    auto = normalizer_report(build_tokenizer(lowercase=True, strip_accents="auto"), bengali, words_file=bengali)
    assert auto["chars_altered"] == 0 and auto["words_altered"] == 0
    english = tmp_path / "en.txt"
    english.write_text("The café in Zürich served naïve crème brûlée to Ångström.\n" * 3, encoding="utf-8")
    latin = normalizer_report(build_tokenizer(lowercase=True, strip_accents="auto"), english)
    assert 0 < latin["chars_altered"] < 0.2 and {t["becomes"] for t in latin["top"]} <= set("aeiou")
    cased = normalizer_report(build_tokenizer(lowercase=False, strip_accents="auto"), english)
    assert cased["chars_altered"] == 0  # cased BERT strips nothing


def test_sentence_encoder_matches_tokenizers_with_the_script_aware_normaliser(tmp_path):
    from pipeline.data.encode import SentenceEncoder

    corpus = tmp_path / "train.txt"
    lines = list(SAMPLES.values()) + ["Café NAÏVE Ångström, don't stop!", "がギ 한국어 Йод ёж"]
    corpus.write_text("\n".join(lines * 10) + "\n", encoding="utf-8")
    train_wordpiece(corpus, tmp_path / "tok", vocab_size=300, lowercase=True, min_frequency=1, progress=False)
    tok = load_tokenizer(tmp_path / "tok")
    enc = SentenceEncoder(tok, np.uint16, max_cache=7)
    assert enc.chunked and enc.python_wordpiece  # the fast paths stay on
    sentences = lines + [s.upper() for s in lines] + ["e\u0301 \u0301x", "a\u200bb  c"]
    ids, lengths = enc.encode(sentences)
    expect = [e.ids for e in tok.encode_batch(sentences, add_special_tokens=False)]
    assert lengths.tolist() == [len(e) for e in expect] and ids.tolist() == [i for e in expect for i in e]


def test_hf_export_keeps_the_script_aware_normaliser(tmp_path):
    transformers = pytest.importorskip("transformers")
    from pipeline.interop.export import write_tokenizer_files
    from pipeline.interop.export_writer import SCRIPT_PROBES

    corpus = tmp_path / "train.txt"
    corpus.write_text("\n".join(list(SAMPLES.values()) * 10) + "\n", encoding="utf-8")
    train_wordpiece(corpus, tmp_path / "tok", vocab_size=300, lowercase=True, min_frequency=1, progress=False)
    tok = load_tokenizer(tmp_path / "tok")
    out = tmp_path / "hf"
    out.mkdir()
    write_tokenizer_files(tok, tmp_path / "tok" / "tokenizer.json", out, 64)
    assert json.loads((out / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    hf = transformers.AutoTokenizer.from_pretrained(str(out))
    texts = SCRIPT_PROBES + list(SAMPLES.values())
    assert [list(x) for x in hf(texts)["input_ids"]] == [e.ids for e in tok.encode_batch(texts)]
    pair = hf(texts[0], texts[1])  # a sentence pair: [CLS] A [SEP] B [SEP] with segment ids, as ours
    ours = tok.encode(texts[0], texts[1])
    assert pair["input_ids"] == ours.ids and pair["token_type_ids"] == ours.type_ids


# ---------------------------------------------------------------------------------------------
# One document per file


def test_document_per_file_layout_with_titles(tmp_path):
    from pipeline.data.clean import clean_corpus
    from pipeline.data.download import download_corpus

    src = tmp_path / "src"
    files = write_bengali_corpus(src, n_files=6)
    params = {
        "source": "local",
        "local": {"path": str(src), "format": "document_per_file", "title_from_filename": True},
    }
    manifest = download_corpus(params, tmp_path / "raw", progress=False)
    assert manifest["format"] == "documents" and manifest["layout"] == "document_per_file"
    assert manifest["total_rows"] == 6 and manifest["titles_from_filenames"] is True
    import pyarrow.parquet as pq

    rows = pq.read_table(tmp_path / "raw" / manifest["parts"][0]["path"]).to_pylist()
    by_source = {Path(r["source"]).name: r["text"] for r in rows}
    first = by_source["হাইড্রোজেন (মৌল).txt"]
    assert first.startswith("হাইড্রোজেন (মৌল).\n\n") and "\n\n" in first[30:]  # title, then paragraphs
    assert by_source["পদ্মা_নদী.txt"].startswith("পদ্মা নদী.")  # '_' is a space, as in Wikipedia titles
    stats = clean_corpus(
        tmp_path / "raw", tmp_path / "clean", min_chars=200, valid_fraction=0.2, seed=0, progress=False
    )
    assert stats["documents"] == 6 and stats["dropped_short"] == 0
    # the same files read as blank-line separated documents: one per paragraph, mostly short, and a hint
    params["local"].update(format="documents", title_from_filename=False)
    manifest = download_corpus(params, tmp_path / "raw2", progress=False)
    assert manifest["total_rows"] > 3 * len(files)
    with pytest.raises(BertraceError, match="download.local.format: document_per_file"):
        clean_corpus(tmp_path / "raw2", tmp_path / "clean2", min_chars=2000, valid_fraction=0.2, seed=0, progress=False)
    with pytest.raises(BertraceError, match="title_from_filename is true but download.local.format is auto"):
        download_corpus(
            {"source": "local", "local": {"path": str(src), "title_from_filename": True}},
            tmp_path / "raw3",
            progress=False,
        )
    with pytest.raises(BertraceError, match="download.hub.format is document_per_file"):
        download_corpus({"source": "hub", "hub": {"format": "document_per_file"}}, tmp_path / "raw4", progress=False)


# ---------------------------------------------------------------------------------------------
# End to end, by params only


def _params(src: Path) -> dict:
    params = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
    params["download"].update(source="local")
    params["download"]["local"].update(path=str(src), format="document_per_file", title_from_filename=True)
    params["clean"].update(min_chars=200, valid_fraction=0.15, workers=1)
    params["tokenizer"].update(vocab_size=600, min_frequency=2)
    params["examples"].update(
        max_seq_len=64, max_predictions_per_seq=10, dupe_factor=2, docs_per_shard=16, row_group_size=64, workers=1
    )
    params["pretrain"].update(
        model={
            "preset": "tiny",
            "hidden_size": 32,
            "num_layers": 1,
            "num_heads": 2,
            "intermediate_size": 64,
            "max_position": 64,
        },
        batch_size=8,
        max_steps=4,
        eval_every=2,
        eval_batches=2,
        log_every=1,
        checkpoint_every=2,
        snapshot_steps=[],
        num_threads=1,
        shuffle_buffer=64,
    )
    return params


def _run_stages(root: Path, monkeypatch, params: dict, stages: list[str]) -> None:
    import importlib

    (root / "params.yaml").write_text(yaml.safe_dump(params, allow_unicode=True, sort_keys=False), encoding="utf-8")
    monkeypatch.chdir(root)
    for name in stages:
        module = importlib.import_module(f"stages.{name}")
        module.main(*([[]] if name in ("validate", "pretrain") else []))


def test_bengali_corpus_runs_download_to_pretrain_by_params_with_mlflow(tmp_path, monkeypatch):
    import mlflow
    import torch

    monkeypatch.setenv("BERTRACE_PIPELINE_RUN_ID", "bengali-e2e")
    before = torch.get_num_threads()
    src = tmp_path / "sources"
    write_bengali_corpus(src)
    root = tmp_path / "repo"
    root.mkdir()
    try:
        _run_stages(
            root, monkeypatch, _params(src), ["download", "clean", "tokenizer", "examples", "validate", "pretrain"]
        )
    finally:
        torch.set_num_threads(before)

    clean = json.loads((root / "reports" / "clean.json").read_text())
    assert clean["documents"] == 48 and clean["dropped_short"] == 0  # one document per file
    tok_metrics = json.loads((root / "reports" / "tokenizer.json").read_text())
    assert tok_metrics["normalizer"]["chars_altered"] == 0 and tok_metrics["unk_rate"] == 0
    # the tokenizer gives the corpus's text back unchanged
    tok = load_tokenizer(root / "data" / "tokenizer" / "tokenizer.json")
    for line in (root / "data" / "clean" / "valid.txt").read_text(encoding="utf-8").splitlines():
        assert tok.normalizer.normalize_str(line) == line
        enc = tok.encode(line, add_special_tokens=False)
        assert "[UNK]" not in enc.tokens and "".join(tok.decode(enc.ids).split()) == "".join(line.split())
    validate = json.loads((root / "reports" / "validate.json").read_text())
    assert validate["success"] and validate["by_expectation"]["normalizer_keeps_letters"] == {
        "checks": 1,
        "failures": 0,
    }
    pretrain = json.loads((root / "reports" / "pretrain.json").read_text())
    assert pretrain["step"] == 4 and {"loss", "mlm_loss", "nsp_loss", "lr"} <= set(pretrain)

    client = mlflow.MlflowClient()
    runs = client.search_runs(
        [e.experiment_id for e in client.search_experiments()],
        filter_string="tags.`bertrace.pipeline_run_id` = 'bengali-e2e'",
    )
    assert sorted(r.data.tags["bertrace.stage"] for r in runs) == sorted(
        ["download", "clean", "tokenizer", "examples", "validate", "pretrain"]
    )
    assert {r.info.status for r in runs} == {"FINISHED"}
    download = next(r for r in runs if r.data.tags["bertrace.stage"] == "download")
    assert download.data.tags["bertrace.inputs"].startswith("48 files")
    files = json.loads(
        Path(client.download_artifacts(download.info.run_id, "files.json", str(tmp_path / "a"))).read_text()
    )
    assert {Path(p).name for p in files["inputs"]} == {p.name for p in src.iterdir()}  # the Bengali names, whole
    names = json.loads(
        Path(client.download_artifacts(download.info.run_id, "names.json", str(tmp_path / "b"))).read_text()
    )
    assert "bertrace.input.অক্সিজেন.txt" in names.values()

    # before: Google's uncased rule on the same corpus — the tokenizer warns, validate stops with one line
    params = _params(src)
    params["tokenizer"]["strip_accents"] = True
    _run_stages(root, monkeypatch, params, ["tokenizer", "examples"])
    damaged = json.loads((root / "reports" / "tokenizer.json").read_text())["normalizer"]
    assert damaged["chars_altered"] > 0.10 and damaged["words_altered"] > 0.4
    with pytest.raises(BertraceError, match=r"tokenizer.strip_accents: auto .*validate.max_chars_altered"):
        _run_stages(root, monkeypatch, params, ["validate"])
    shutil.rmtree(root / "data" / "pretrain", ignore_errors=True)


def test_hf_export_of_a_classifier_with_the_script_aware_tokenizer_verifies(tmp_path):
    """`bertrace export --hf` on a model whose tokenizer is strip_accents: auto: transformers loads it
    back (AutoTokenizer) with the same ids, segment ids and logits (export_hf's own verification)."""
    pytest.importorskip("transformers")
    from pipeline.interop.export import export_hf
    from tests.support.chain import make_finetuned, sentences

    corpus = tmp_path / "train.txt"
    corpus.write_text("\n".join(list(SAMPLES.values()) * 5 + sentences(200, 0)) + "\n", encoding="utf-8")
    train_wordpiece(corpus, tmp_path / "tok", vocab_size=500, lowercase=True, min_frequency=1, progress=False)
    model = make_finetuned(
        tmp_path / "ft", tokenizer=tmp_path / "tok" / "tokenizer.json", text_columns=("premise", "hypothesis")
    )
    info = export_hf(model, tmp_path / "hf")
    assert info["verification"]["tokenizer_ids_equal"] and info["verification"]["max_abs_logit_diff"] < 1e-4
