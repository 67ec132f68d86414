"""The validate stage's checks: clean data passes, and every planted defect is named.

Each defect test starts from a copy of a small, correct examples directory (built here per the
SPEC schema), plants exactly one defect, refreshes the manifest's hashes and counts where the
defect is not about them, and asserts the report names the expectation, the file and a bad row.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.checks.report import CheckResult, ValidationReport
from pipeline.checks.validate_corpus import validate_corpus
from pipeline.checks.validate_shards import validate_shards
from pipeline.core.io import read_json, sha256_file, write_json
from tests.support.shards import (
    MASK,
    MAX_LEN,
    MAX_PRED,
    PROB,
    SEP,
    VOCAB,
    make_rows,
    refresh_manifest,
    rewrite,
    unmasked,
    write_examples,
    write_shard,
)

# ---------------------------------------------------------------------------------------------
# Building correct shards


@pytest.fixture(scope="module")
def clean_static(tmp_path_factory) -> Path:
    return write_examples(tmp_path_factory.mktemp("static"))


@pytest.fixture
def ex(clean_static, tmp_path) -> Path:
    """A fresh, correct copy to plant a defect in."""
    return Path(shutil.copytree(clean_static, tmp_path / "examples"))


def failed(report: ValidationReport, expectation: str) -> list[CheckResult]:
    return [r for r in report.failures if r.expectation.startswith(expectation)]


def assert_only_failure(report: ValidationReport, expectation: str, target: str, row: int | None = None) -> CheckResult:
    """The report fails on exactly this expectation and file, with the bad row among the samples."""
    fails = [(r.expectation, Path(r.target).name) for r in report.failures]
    assert not report.success
    assert len(report.failures) == 1, fails
    (r,) = report.failures
    assert r.expectation.startswith(expectation), fails
    assert r.target.endswith(target), fails
    if row is not None:
        assert r.unexpected_count >= 1
        assert row in [s["row"] for s in r.sample_rows], r.sample_rows
    text = report.format_text()
    assert expectation in text and target in text and "FAIL" in text
    json.dumps(report.to_dict())  # JSON-able for metrics/validate.json
    return r


# ---------------------------------------------------------------------------------------------
# Shards: clean data


def test_clean_static_shards_pass(clean_static):
    report = validate_shards(clean_static)
    assert report.success, report.format_text()
    names = {r.expectation for r in report.results}
    for expected in [
        "sha256_matches_manifest",
        "expect_column_values_to_be_in_set(first_token_id)",
        "expect_column_values_to_be_in_set(sep_count)",
        "expect_column_values_to_be_between(length)",
        "expect_column_values_to_be_in_set(token_type_errors)",
        "expect_column_pair_values_a_to_be_greater_than_b(length, max_masked_position)",
        "expect_column_sum_to_be_between(not_next)",
        "expect_column_sum_to_be_between(masked)",
    ]:
        assert expected in names
    # Train (300 rows) is judged on NSP balance; valid (60 rows) is only reported, with a note.
    nsp = {
        Path(r.target).name: r for r in report.results if r.expectation == "expect_column_sum_to_be_between(not_next)"
    }
    assert nsp["train"].observed["mean"] == pytest.approx(0.5) and not nsp["train"].message.startswith("skipped")
    assert nsp["train"].observed["rows"] == 300 and nsp["train"].observed["not_next"] == 150
    assert nsp["valid"].message.startswith("skipped") and nsp["valid"].observed["mean"] == pytest.approx(0.5)
    assert "NOTE" in report.format_text() and "validation passed" in report.format_text()
    rate = next(
        r
        for r in report.results
        if r.expectation == "expect_column_sum_to_be_between(masked)" and r.target.endswith("train")
    ).observed["rate"]
    assert abs(rate - PROB) < 0.02
    d = report.to_dict()
    assert d["success"] and d["failures"] == 0 and d["checks"] == len(report.results)
    json.dumps(d)


def test_clean_dynamic_shards_pass_and_mask_token_fails(tmp_path):
    root = write_examples(tmp_path / "dyn", static=False)
    report = validate_shards(root)
    assert report.success, report.format_text()
    assert not any("(masked" in r.expectation for r in report.results)

    def plant_mask(rows):
        rows[7]["input_ids"][3] = MASK

    rewrite(root, "valid/shard-00000.parquet", plant_mask)
    r = assert_only_failure(
        validate_shards(root), "expect_column_values_to_be_in_set(mask_token_count)", "valid/shard-00000.parquet", row=7
    )
    assert r.sample_rows[0]["input_ids"][3] == MASK


def test_dynamic_manifest_with_mask_columns_fails(ex):
    m = read_json(ex / "manifest.json")
    m["masking"] = "dynamic"
    write_json(ex / "manifest.json", m)
    report = validate_shards(ex)
    fails = failed(report, "expect_table_columns_to_match_set")
    assert {Path(r.target).name for r in fails} == {"shard-00000.parquet", "shard-00001.parquet"}
    assert set(fails[0].observed["mismatched"]["unexpected"]) == {"masked_lm_positions", "masked_lm_ids"}
    assert "masked_lm_positions" in fails[0].message


# ---------------------------------------------------------------------------------------------
# Shards: one planted defect each


def test_first_token_not_cls(ex):
    def plant(rows):
        rows[5]["input_ids"][0] = 17

    rewrite(ex, "train/shard-00001.parquet", plant)
    r = assert_only_failure(
        validate_shards(ex), "expect_column_values_to_be_in_set(first_token_id)", "train/shard-00001.parquet", row=5
    )
    assert r.sample_rows[0]["first_token_id"] == 17 and r.sample_rows[0]["input_ids"][0] == 17
    assert r.observed["unexpected_values"] == [{"value": 17, "count": 1}]


def test_three_seps(ex):
    def plant(rows):
        rows[3]["input_ids"].append(SEP)
        rows[3]["token_type_ids"].append(1)

    rewrite(ex, "train/shard-00000.parquet", plant)
    r = assert_only_failure(
        validate_shards(ex), "expect_column_values_to_be_in_set(sep_count)", "train/shard-00000.parquet", row=3
    )
    assert r.sample_rows[0]["sep_count"] == 3


def test_last_token_not_sep(ex):
    def plant(rows):
        row = rows[9]
        i = unmasked(row, row["token_type_ids"].index(1))  # a token of B, then move the final [SEP] before it
        row["input_ids"][-1], row["input_ids"][i] = row["input_ids"][i], SEP

    rewrite(ex, "train/shard-00000.parquet", plant)
    r = assert_only_failure(
        validate_shards(ex), "expect_column_values_to_be_in_set(last_token_id)", "train/shard-00000.parquet", row=9
    )
    assert r.sample_rows[0]["input_ids"][-1] != SEP


def test_id_out_of_vocab(ex):
    def plant(rows):
        rows[11]["input_ids"][unmasked(rows[11])] = VOCAB + 5

    rewrite(ex, "valid/shard-00000.parquet", plant)
    r = assert_only_failure(
        validate_shards(ex), "expect_column_values_to_be_between(max_token_id)", "valid/shard-00000.parquet", row=11
    )
    assert r.sample_rows[0]["max_token_id"] == VOCAB + 5


def test_sequence_too_long(ex):
    def plant(rows):
        row = rows[0]
        extra = MAX_LEN + 3 - len(row["input_ids"])
        row["input_ids"][-1:-1] = [50] * extra
        row["token_type_ids"] += [1] * extra

    rewrite(ex, "train/shard-00001.parquet", plant)
    r = assert_only_failure(
        validate_shards(ex), "expect_column_values_to_be_between(length)", "train/shard-00001.parquet", row=0
    )
    assert r.sample_rows[0]["length"] == MAX_LEN + 3


def test_bad_segment_ids(ex):
    def plant(rows):
        rows[4]["token_type_ids"][2] = 1  # inside segment A

    rewrite(ex, "train/shard-00000.parquet", plant)
    r = assert_only_failure(
        validate_shards(ex), "expect_column_values_to_be_in_set(token_type_errors)", "train/shard-00000.parquet", row=4
    )
    assert r.sample_rows[0]["token_type_ids"][2] == 1


def test_segment_ids_wrong_length(ex):
    def plant(rows):
        rows[8]["token_type_ids"].pop()

    rewrite(ex, "train/shard-00000.parquet", plant)
    assert_only_failure(
        validate_shards(ex),
        "expect_column_values_to_be_in_set(token_type_length_diff)",
        "train/shard-00000.parquet",
        row=8,
    )


def test_nsp_label_out_of_set(ex):
    def plant(rows):
        rows[12]["next_sentence_label"] = 2
        rows[13]["next_sentence_label"] = -1
        rows[14]["next_sentence_label"] = 1 - rows[14]["next_sentence_label"]  # keep the mean in range

    rewrite(ex, "train/shard-00000.parquet", plant)
    report = validate_shards(ex)
    (r,) = failed(report, "expect_column_values_to_be_in_set(next_sentence_label)")
    assert r.target.endswith("train/shard-00000.parquet") and r.unexpected_count == 2
    assert {s["row"] for s in r.sample_rows} == {12, 13}


def test_nsp_imbalance(ex):
    for rel in ["train/shard-00000.parquet", "train/shard-00001.parquet"]:
        rewrite(ex, rel, lambda rows: [r.update(next_sentence_label=0 if i % 4 else 1) for i, r in enumerate(rows)])
    r = assert_only_failure(validate_shards(ex), "expect_column_sum_to_be_between(not_next)", "train")
    assert r.observed["mean"] == pytest.approx(0.25, abs=0.01) and r.observed["expected"] == [0.42, 0.58]
    assert r.sample_rows and r.sample_rows[0]["shard"].endswith(".parquet")
    assert r.sample_rows[0]["nsp_label_mean"] == pytest.approx(0.25, abs=0.02)
    assert "document_per_file" not in r.message  # too few random Bs: not the short-documents case


def test_nsp_mean_too_high_says_what_short_documents_do(ex):
    for rel in ["train/shard-00000.parquet", "train/shard-00001.parquet"]:
        rewrite(ex, rel, lambda rows: [r.update(next_sentence_label=1 if i % 4 else 0) for i, r in enumerate(rows)])
    r = assert_only_failure(validate_shards(ex), "expect_column_sum_to_be_between(not_next)", "train")
    assert r.observed["mean"] == pytest.approx(0.75, abs=0.01)
    assert "document_per_file" in r.message and "validate.nsp_tolerance" in r.message  # what to do about it
    # these shards' pairs are 32 WordPieces long: short pairs are named as a cause too
    assert r.message.endswith(
        "; or short pairs: examples.max_seq_len is 32, so a chunk of 29 WordPieces often holds one sentence: "
        "raise it (BERT: 128)"
    ), r.message


def test_normalizer_check_fails_when_uncased_stripping_deletes_letters(tmp_path):
    """The tokenizer's normaliser on the corpus: Google's uncased rule deletes Bengali viramas and vowel
    signs (a failure naming the params to change); strip_accents: auto keeps them; English passes."""
    from pipeline.checks.validate import NORMALIZER_CHECK, validate_normalizer
    from pipeline.core.formats import SPECIAL_TOKENS
    from pipeline.data.tokenizer import build_tokenizer

    corpus = tmp_path / "train.txt"
    corpus.write_text("অক্সিজেন একটি রাসায়নিক মৌল। পৃথিবীর বায়ুমণ্ডলে অক্সিজেন দ্বিতীয় সর্বাধিক গ্যাস।\n" * 5, encoding="utf-8")
    for strip, ok in ((True, False), ("auto", True), (False, True)):
        path = tmp_path / f"tok-{strip}.json"
        tok = build_tokenizer(lowercase=True, strip_accents=strip)
        tok.add_special_tokens(list(SPECIAL_TOKENS))  # ids 0..4, as the tokenizer stage's
        path.write_text(tok.to_str(), encoding="utf-8")
        r = validate_normalizer(path, corpus, max_chars_altered=0.05)
        assert r.expectation == NORMALIZER_CHECK and r.success is ok, r.message
        assert r.observed["strip_accents"] == strip and r.observed["lowercase"] is True
    assert r.observed["chars_altered"] == 0
    bad = validate_normalizer(tmp_path / "tok-True.json", corpus, max_chars_altered=0.05)
    assert bad.observed["chars_altered"] > 0.1 and bad.sample_rows[0]["name"] == "BENGALI SIGN VIRAMA"
    assert "\n" not in bad.message and "অক্সিজেন → অকসিজেন" in bad.message
    assert "tokenizer.strip_accents: auto" in bad.message and "validate.max_chars_altered" in bad.message
    assert not validate_normalizer(tmp_path / "absent.json", corpus, max_chars_altered=0.05).success


def test_mask_rate_off(ex):
    # Train shards masked at 5% while the manifest promises 15%.
    rng_rows = {0: make_rows(150, 0, prob=0.05), 1: make_rows(150, 1, prob=0.05)}
    for k, rows in rng_rows.items():
        write_shard(ex / f"train/shard-{k:05d}.parquet", rows, True)
    refresh_manifest(ex)
    r = assert_only_failure(validate_shards(ex), "expect_column_sum_to_be_between(masked)", "train")
    assert r.observed["rate"] < PROB - 0.03
    assert r.sample_rows[0]["rate"] < 0.1 and r.sample_rows[0]["shard"].endswith(".parquet")


def test_masked_position_on_sep(ex):
    def plant(rows):
        row = next(r for r in rows[20:] if len(r["masked_lm_positions"]) < MAX_PRED)
        sep = row["input_ids"].index(SEP)
        pairs = sorted(zip(row["masked_lm_positions"] + [sep], row["masked_lm_ids"] + [SEP]))
        row["masked_lm_positions"], row["masked_lm_ids"] = [p for p, _ in pairs], [i for _, i in pairs]

    rows_before = pq.read_table(ex / "valid/shard-00000.parquet").to_pylist()
    bad = next(i for i, r in enumerate(rows_before) if i >= 20 and len(r["masked_lm_positions"]) < MAX_PRED)
    rewrite(ex, "valid/shard-00000.parquet", plant)
    r = assert_only_failure(
        validate_shards(ex), "expect_column_values_to_be_in_set(masked_special)", "valid/shard-00000.parquet", row=bad
    )
    assert SEP in r.sample_rows[0]["masked_lm_ids"]


def test_masked_positions_not_increasing(ex):
    def plant(rows):
        p = rows[2]["masked_lm_positions"]
        p[0], p[1] = p[1], p[0]
        i = rows[2]["masked_lm_ids"]
        i[0], i[1] = i[1], i[0]

    rewrite(ex, "train/shard-00000.parquet", plant)
    assert_only_failure(
        validate_shards(ex),
        "expect_column_values_to_be_in_set(positions_not_increasing)",
        "train/shard-00000.parquet",
        row=2,
    )


def test_masked_position_outside_sequence(ex):
    rows = pq.read_table(ex / "train/shard-00001.parquet").to_pylist()
    bad = next(i for i, r in enumerate(rows) if len(r["masked_lm_positions"]) < MAX_PRED)

    def plant(rows):
        rows[bad]["masked_lm_positions"].append(len(rows[bad]["input_ids"]) + 4)
        rows[bad]["masked_lm_ids"].append(77)

    rewrite(ex, "train/shard-00001.parquet", plant)
    r = assert_only_failure(
        validate_shards(ex),
        "expect_column_pair_values_a_to_be_greater_than_b(length, max_masked_position)",
        "train/shard-00001.parquet",
        row=bad,
    )
    assert r.sample_rows[0]["max_masked_position"][1] == len(r.sample_rows[0]["input_ids"]) + 4


def test_too_many_masked_positions_and_label_length(ex):
    def plant(rows):
        row = rows[1]
        free = [
            i
            for i in range(1, len(row["input_ids"]) - 1)
            if i not in row["masked_lm_positions"] and row["input_ids"][i] > MASK
        ]
        add = free[: MAX_PRED + 1 - len(row["masked_lm_positions"])]
        pairs = sorted(zip(row["masked_lm_positions"] + add, row["masked_lm_ids"] + [row["input_ids"][i] for i in add]))
        row["masked_lm_positions"], row["masked_lm_ids"] = [p for p, _ in pairs], [i for _, i in pairs]
        rows[2]["masked_lm_ids"].pop()

    rewrite(ex, "train/shard-00000.parquet", plant)
    report = validate_shards(ex)
    assert {r.expectation for r in report.failures} == {
        "expect_column_values_to_be_between(masked_count)",
        "expect_column_values_to_be_in_set(masked_lm_length_diff)",
    }
    assert [s["row"] for s in failed(report, "expect_column_values_to_be_between(masked_count)")[0].sample_rows] == [1]
    assert [
        s["row"] for s in failed(report, "expect_column_values_to_be_in_set(masked_lm_length_diff)")[0].sample_rows
    ] == [2]


def test_stray_mask_token(ex):
    def plant(rows):
        rows[30]["input_ids"][unmasked(rows[30])] = MASK

    rewrite(ex, "train/shard-00000.parquet", plant)
    assert_only_failure(
        validate_shards(ex), "expect_column_values_to_be_in_set(stray_mask_tokens)", "train/shard-00000.parquet", row=30
    )


def test_null_values(ex):
    def plant(rows):
        rows[10]["input_ids"][4] = None

    rewrite(ex, "train/shard-00000.parquet", plant)
    report = validate_shards(ex)
    (r,) = failed(report, "expect_column_values_to_be_in_set(null_values)")
    assert r.target.endswith("train/shard-00000.parquet") and r.sample_rows[0]["row"] == 10


def test_tampered_shard_sha_mismatch(ex):
    rel = "train/shard-00001.parquet"
    manifest_sha = read_json(ex / "manifest.json")["splits"]["train"]["shards"][1]["sha256"]
    # Same rows, different bytes (another codec); the manifest is left as it was.
    write_shard(ex / rel, pq.read_table(ex / rel).to_pylist(), True, compression="snappy")
    r = assert_only_failure(validate_shards(ex), "sha256_matches_manifest", rel)
    assert r.observed == {"manifest": manifest_sha, "actual": sha256_file(ex / rel)}
    assert manifest_sha != r.observed["actual"] and "sha256 differs" in r.message


def test_row_count_mismatch(ex):
    m = read_json(ex / "manifest.json")
    m["splits"]["valid"]["shards"][0]["rows"] = 61
    write_json(ex / "manifest.json", m)
    report = validate_shards(ex)
    (r,) = failed(report, "expect_table_row_count_to_equal")
    assert r.target.endswith("valid/shard-00000.parquet") and r.observed == 60


def test_token_and_split_counts_vs_manifest(ex):
    m = read_json(ex / "manifest.json")
    m["splits"]["train"]["shards"][0]["tokens"] += 1
    m["splits"]["valid"]["rows"] += 3
    m["splits"]["valid"]["tokens"] -= 2
    write_json(ex / "manifest.json", m)
    report = validate_shards(ex)
    got = {(r.expectation, str(Path(r.target).relative_to(ex))): r for r in report.failures}
    assert set(got) == {
        ("expect_column_sum_to_be_between(length)", "train/shard-00000.parquet"),
        ("expect_column_sum_to_be_between(rows)", "valid"),
        ("expect_column_sum_to_be_between(tokens)", "valid"),
    }
    assert got[("expect_column_sum_to_be_between(rows)", "valid")].observed == 60


def test_masked_label_out_of_vocab_and_empty_row(ex):
    def plant(rows):
        rows[3]["masked_lm_ids"][0] = VOCAB
        rows[4].update(input_ids=[], token_type_ids=[], masked_lm_positions=[], masked_lm_ids=[])

    rewrite(ex, "valid/shard-00000.parquet", plant)
    report = validate_shards(ex)
    (r,) = failed(report, "expect_column_values_to_be_between(max_masked_lm_id)")
    assert [s["row"] for s in r.sample_rows] == [3] and r.sample_rows[0]["masked_lm_ids"][0] == VOCAB
    (r,) = failed(report, "expect_column_values_to_be_between(length)")
    assert [s["row"] for s in r.sample_rows] == [4] and r.sample_rows[0]["length"] == 0


def test_missing_shard(ex):
    (ex / "valid/shard-00000.parquet").unlink()
    r = assert_only_failure(validate_shards(ex), "shard_exists", "valid/shard-00000.parquet")
    assert "missing" in r.message
    assert "skipped" in validate_shards(ex).format_text()


def test_stale_extra_shard(ex):
    shutil.copy(ex / "train/shard-00000.parquet", ex / "train/shard-00007.parquet")
    r = assert_only_failure(validate_shards(ex), "shard_listed_in_manifest", "train/shard-00007.parquet")
    assert "stale" in r.message


def test_missing_column(ex):
    path = ex / "train/shard-00000.parquet"
    pq.write_table(pq.read_table(path).drop_columns(["token_type_ids"]), path)
    refresh_manifest(ex)
    r = assert_only_failure(validate_shards(ex), "expect_table_columns_to_match_set", "train/shard-00000.parquet")
    assert r.observed["mismatched"]["missing"] == ["token_type_ids"]
    assert "token_type_ids" in r.message


def test_wrong_column_type(ex):
    path = ex / "valid/shard-00000.parquet"
    t = pq.read_table(path)
    t = t.set_column(2, "next_sentence_label", t["next_sentence_label"].cast(pa.int64()))
    pq.write_table(t, path)
    refresh_manifest(ex)
    r = assert_only_failure(validate_shards(ex), "parquet_column_types", "valid/shard-00000.parquet")
    assert "next_sentence_label: int64" in r.message


def test_corrupt_parquet(ex):
    (ex / "train/shard-00000.parquet").write_bytes(b"PAR1 this is not parquet at all")
    refresh_manifest_sha_only(ex)
    r = assert_only_failure(validate_shards(ex), "parquet_readable", "train/shard-00000.parquet")
    assert "cannot read as Parquet" in r.message


def refresh_manifest_sha_only(root: Path) -> None:
    m = read_json(root / "manifest.json")
    for info in m["splits"].values():
        for s in info["shards"]:
            s["sha256"] = sha256_file(root / s["path"])
    write_json(root / "manifest.json", m)


@pytest.mark.parametrize(
    "content,needle", [(None, "not found"), ("{not json", "not valid JSON"), ('{"masking": "static"}', "missing key")]
)
def test_bad_manifest(tmp_path, content, needle):
    if content is not None:
        (tmp_path / "manifest.json").write_text(content)
    report = validate_shards(tmp_path)
    (r,) = report.results
    assert not report.success and r.expectation == "manifest_readable"
    assert r.target.endswith("manifest.json") and needle in r.message


# ---------------------------------------------------------------------------------------------
# Clean corpus

DOC = "This is a perfectly ordinary article number {} with enough characters to pass the minimum length."


def corpus(tmp_path: Path, train: list[str], valid: list[str] | None = None) -> list[Path]:
    files = []
    for name, docs in [("train.txt", train), ("valid.txt", valid)]:
        if docs is not None:
            p = tmp_path / name
            p.write_bytes("".join(d + "\n" for d in docs).encode("utf-8"))
            files.append(p)
    return files


def only_corpus_failure(report: ValidationReport, expectation: str, target: str, line: int) -> CheckResult:
    assert not report.success
    fails = [(r.expectation, Path(r.target).name) for r in report.failures]
    assert len(report.failures) == 1, fails
    (r,) = report.failures
    assert r.expectation == expectation and r.target.endswith(target), fails
    assert line in [s["line"] for s in r.sample_rows], r.sample_rows
    assert target in report.format_text()
    json.dumps(report.to_dict())
    return r


TRAIN = [DOC.format(i) for i in range(40)]
VALID = [DOC.format(i) for i in range(100, 105)]


def test_clean_corpus_passes(tmp_path):
    report = validate_corpus(corpus(tmp_path, TRAIN, VALID), min_chars=50, max_chars=500)
    assert report.success, report.format_text()
    assert {Path(r.target).name for r in report.results} == {"train.txt", "valid.txt"}
    assert any(r.expectation == "expect_column_values_to_be_unique(document_hash across files)" for r in report.results)


def test_corpus_empty_line(tmp_path):
    train = TRAIN[:5] + [""] + TRAIN[5:]
    r = only_corpus_failure(
        validate_corpus(corpus(tmp_path, train, VALID), min_chars=0),
        "expect_column_values_to_not_match_regex(text)",
        "train.txt",
        line=6,
    )
    assert "empty" in r.message


def test_corpus_duplicate(tmp_path):
    train = TRAIN + [TRAIN[3]]
    r = only_corpus_failure(
        validate_corpus(corpus(tmp_path, train, VALID), min_chars=50),
        "expect_column_values_to_be_unique(document_hash)",
        "train.txt",
        line=41,
    )
    assert {s["first_seen_line"] for s in r.sample_rows} == {4}


def test_corpus_too_short_and_too_long(tmp_path):
    train = TRAIN[:7] + ["short"] + TRAIN[7:]
    r = only_corpus_failure(
        validate_corpus(corpus(tmp_path, train, VALID), min_chars=50),
        "expect_column_value_lengths_to_be_between(text)",
        "train.txt",
        line=8,
    )
    assert r.sample_rows[0]["chars"] == 5
    valid = VALID + ["x" * 1000]
    only_corpus_failure(
        validate_corpus(corpus(tmp_path, TRAIN, valid), min_chars=50, max_chars=500),
        "expect_column_value_lengths_to_be_between(text)",
        "valid.txt",
        line=6,
    )


@pytest.mark.parametrize("sep", ["\r", "\u2028", "\x85", "\x0b", "\x0c", "\x1d"])
def test_corpus_embedded_line_separator(tmp_path, sep):
    valid = VALID[:2] + ["first half of an article" + sep + "second half of the same article here"] + VALID[2:]
    r = only_corpus_failure(
        validate_corpus(corpus(tmp_path, TRAIN, valid), min_chars=50),
        "expect_column_values_to_not_match_regex(text)",
        "valid.txt",
        line=3,
    )
    assert sep.encode("unicode_escape").decode() in r.sample_rows[0]["text"]


def test_corpus_crlf_file(tmp_path):
    p = tmp_path / "train.txt"
    p.write_bytes("".join(d + "\r\n" for d in TRAIN).encode())
    report = validate_corpus([p], min_chars=50)
    (r,) = report.failures
    assert r.expectation == "expect_column_values_to_not_match_regex(text)" and r.unexpected_count == len(TRAIN)


def test_corpus_train_valid_overlap(tmp_path):
    valid = VALID + [TRAIN[12]]
    report = validate_corpus(corpus(tmp_path, TRAIN, valid), min_chars=50)
    fails = {Path(r.target).name: r for r in report.failures}
    assert set(fails) == {"train.txt", "valid.txt"}
    for r in fails.values():
        assert (
            r.expectation == "expect_column_values_to_be_unique(document_hash across files)" and r.unexpected_count == 1
        )
    assert fails["valid.txt"].sample_rows == [{"line": 6, "also_in": f"{tmp_path / 'train.txt'}:13"}]
    assert fails["train.txt"].sample_rows == [{"line": 13, "also_in": f"{tmp_path / 'valid.txt'}:6"}]


def test_corpus_empty_file(tmp_path):
    files = corpus(tmp_path, TRAIN, [])
    report = validate_corpus(files, min_chars=50)
    (r,) = report.failures
    assert r.expectation == "expect_table_row_count_to_be_between" and r.target.endswith("valid.txt")
    assert r.observed == 0 and "file is empty" in r.message


def test_corpus_row_bounds_missing_file_bad_utf8(tmp_path):
    files = corpus(tmp_path, TRAIN)
    (r,) = validate_corpus(files, min_chars=50, max_rows=10).failures
    assert r.expectation == "expect_table_row_count_to_be_between" and r.observed == 40
    (tmp_path / "bad.txt").write_bytes(b"fine line of text\nbad \xff byte\n")
    report = validate_corpus([tmp_path / "nope.txt", tmp_path / "bad.txt"], min_chars=1)
    assert [(r.expectation, Path(r.target).name) for r in report.failures] == [
        ("file_exists", "nope.txt"),
        ("utf8_decodable", "bad.txt"),
    ]
    assert report.failures[1].sample_rows == [{"line": 2, "byte": 22}]


def test_corpus_streamed_in_chunks(tmp_path, monkeypatch):
    """Results of small chunks merge into one per file, with file-wide line numbers."""
    import pipeline.checks.validate_corpus as V

    monkeypatch.setattr(V, "CORPUS_CHUNK_BYTES", 1000)  # ~10 documents per chunk
    train = TRAIN[:15] + ["too short"] + TRAIN[15:30] + ["tiny"] + TRAIN[30:] + [TRAIN[33], "x\ry" * 30]
    report = validate_corpus(corpus(tmp_path, train, VALID), min_chars=50)
    fails = {r.expectation: r for r in report.failures}
    assert set(fails) == {
        "expect_column_value_lengths_to_be_between(text)",
        "expect_column_values_to_be_unique(document_hash)",
        "expect_column_values_to_not_match_regex(text)",
    }
    short = fails["expect_column_value_lengths_to_be_between(text)"]
    assert short.unexpected_count == 2 and [s["line"] for s in short.sample_rows] == [16, 32]
    assert short.observed["rows"] == len(train)
    dup = fails["expect_column_values_to_be_unique(document_hash)"]
    assert [(s["line"], s["first_seen_line"]) for s in dup.sample_rows] == [(36, 36), (43, 36)]
    assert dup.sample_rows[0]["text"].startswith("This is a perfectly ordinary article number 33")
    (sep,) = fails["expect_column_values_to_not_match_regex(text)"].sample_rows
    assert sep["line"] == 44 and "\\r" in sep["text"]
    rows = next(
        r
        for r in report.results
        if r.expectation == "expect_table_row_count_to_be_between" and r.target.endswith("train.txt")
    )
    assert rows.success and rows.observed == len(train)


def test_corpus_whitespace_only_line(tmp_path):
    train = TRAIN[:2] + ["\u00a0 \u3000\t"] + TRAIN[2:]
    r = only_corpus_failure(
        validate_corpus(corpus(tmp_path, train, VALID), min_chars=0),
        "expect_column_values_to_not_match_regex(text)",
        "train.txt",
        line=3,
    )
    assert "empty" in r.message
