"""The shard checks in batches and on workers: one GX run for the rows of many shards, yet every
failure names its own shard and the rows within it, and the report (reports/validate.json) and the
Data Docs results are the same for any batch size, number of workers and engine."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from pipeline.checks import validate_shards as vs
from pipeline.checks.validate import ValidateConfig
from pipeline.core.errors import BertraceError
from pipeline.core.io import read_json, write_json
from pipeline.data.engine import Engine, EngineParams
from tests.conftest import REPO
from tests.support import shards as S

LAYOUT = {"train": [150, 120, 90, 150], "valid": [60, 70]}


@pytest.fixture(scope="module")
def many(tmp_path_factory, monkeypatch_module) -> Path:
    monkeypatch_module.setattr(S, "LAYOUT", LAYOUT)
    return S.write_examples(tmp_path_factory.mktemp("many"))


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


@pytest.fixture(scope="module")
def broken(many, tmp_path_factory) -> Path:
    """Defects in four shards (the first one too), one shard's row count wrong in the manifest."""
    root = Path(shutil.copytree(many, tmp_path_factory.mktemp("broken") / "ex"))

    def not_cls(rows):
        rows[5]["input_ids"][0] = 17
        rows[9]["input_ids"][0] = 17

    def third_sep(rows):
        rows[7]["input_ids"][4] = S.SEP

    def segment(rows):
        rows[2]["token_type_ids"][1] = 1

    S.rewrite(root, "train/shard-00001.parquet", not_cls)
    S.rewrite(root, "train/shard-00003.parquet", not_cls)
    S.rewrite(root, "valid/shard-00001.parquet", third_sep)
    S.rewrite(root, "train/shard-00000.parquet", segment)
    m = read_json(root / "manifest.json")
    m["splits"]["train"]["shards"][2]["rows"] += 1
    write_json(root / "manifest.json", m)
    return root


@pytest.fixture(scope="module")
def reference(broken) -> tuple[str, list]:
    """The report and Data Docs results of ``broken`` in batches of ~300 rows, in this process."""
    return _report(broken, batch_rows=300)


def _report(root: Path, **kw) -> tuple[str, list]:
    r = vs.validate_shards(root, **kw)
    docs = [(g.meta["run_id"].run_name, g.suite_name, g.success) for g in r.gx_results]
    return json.dumps(r.to_dict(), sort_keys=True), docs


def test_two_bad_shards_in_one_batch_are_each_named_with_their_own_rows(broken):
    report = vs.validate_shards(broken, batch_rows=10**6)  # every shard in one batch
    fails = {(Path(r.target).parent.name, Path(r.target).name, r.expectation): r for r in report.failures}
    first = fails[("train", "shard-00001.parquet", "expect_column_values_to_be_in_set(first_token_id)")]
    again = fails[("train", "shard-00003.parquet", "expect_column_values_to_be_in_set(first_token_id)")]
    for r in (first, again):
        assert [s["row"] for s in r.sample_rows] == [5, 9] and r.unexpected_count == 2
        assert [s["input_ids"][0] for s in r.sample_rows] == [17, 17]
        assert r.observed == {"rows": 150 if r is again else 120, "unexpected_values": [{"value": 17, "count": 2}]}
    sep = fails[("valid", "shard-00001.parquet", "expect_column_values_to_be_in_set(sep_count)")]
    assert [s["row"] for s in sep.sample_rows] == [7] and sep.observed["rows"] == 70
    types = fails[("valid", "shard-00001.parquet", "expect_column_values_to_be_in_set(token_type_errors)")]
    assert [s["row"] for s in types.sample_rows] == [7]  # segment B now starts after the extra [SEP]
    rows = fails[("train", "shard-00002.parquet", "expect_table_row_count_to_equal")]
    assert rows.observed == 90
    seg = fails[("train", "shard-00000.parquet", "expect_column_values_to_be_in_set(token_type_errors)")]
    assert [s["row"] for s in seg.sample_rows] == [2]
    assert len(report.failures) == 6, sorted(fails)
    text = report.format_text()
    assert str(broken / "train" / "shard-00003.parquet") in text


@pytest.mark.parametrize("batch_rows", [1, 10**6])
def test_report_and_data_docs_are_the_same_for_any_batch_size(broken, reference, batch_rows):
    assert _report(broken, batch_rows=batch_rows) == reference


def test_first_batch_unreadable_data_docs_still_open_with_the_first_checked_shard(broken, tmp_path):
    root = Path(shutil.copytree(broken, tmp_path / "ex"))
    for f in (root / "train").glob("*.parquet"):
        f.unlink()
    report, docs = _report(root, batch_rows=200)
    assert _report(root, batch_rows=10**6) == (report, docs)
    first_runs = [d for d in docs if d[1] in ("shard columns", "shard rows")][:2]
    assert [d[0] for d in first_runs] == [str(root / "valid" / "shard-00000.parquet").replace("/", "\u2215")] * 2


def test_batches_are_cut_by_rows_in_manifest_order():
    entries = [("train", f"s{i}", {"rows": n}) for i, n in enumerate([5, 5, 5, 20, 1, 1])]
    assert [[e[1] for e in b] for b in vs._batches(entries, 10)] == [["s0", "s1"], ["s2", "s3"], ["s4", "s5"]]
    assert len(vs._batches(entries, 10**6)) == 1
    # two workers: once fewer than 2 x 200k rows are left, a batch takes half of them, down to 50k
    many = [("train", f"s{i}", {"rows": 10_000}) for i in range(200)]  # 2M rows
    sizes = [sum(e[2]["rows"] for e in b) for b in vs._batches(many, 200_000, workers=2)]
    assert sizes == [200_000] * 9 + [100_000, 50_000, 50_000]
    assert [sum(e[2]["rows"] for e in b) for b in vs._batches(many, 200_000)] == [200_000] * 10


@pytest.mark.slow
def test_report_is_the_same_with_one_and_two_workers(broken, reference):
    """Two local worker processes (batches of ~200 rows: several tasks) write the same report bytes as one."""
    assert _report(broken, engine=Engine("local", 2), batch_rows=200) == reference


@pytest.mark.slow
def test_report_is_the_same_on_a_dask_cluster(broken, reference):
    pytest.importorskip("distributed", reason="pip install 'bertrace[dask]'")
    assert _report(broken, engine=Engine("dask", 2), batch_rows=200) == reference  # a LocalCluster of 2 workers


def test_stage_report_bytes_do_not_depend_on_workers(many, tmp_path):
    """`python -m stages.validate --shards DIR --workers N`: reports/validate.json byte-identical for 1 and 2."""
    from stages import validate as stage

    out = {}
    for w in (1, 2):
        path = tmp_path / f"w{w}.json"
        stage.main(["--shards", str(many), "--workers", str(w), "--report", str(path)])
        out[w] = path.read_bytes()
    assert out[1] == out[2] and json.loads(out[1])["success"]


def test_engine_keys_set_speed_only_and_dvc_tracks_the_check_keys():
    cfg = ValidateConfig.from_params({"workers": 2, "engine": "dask", "dask_scheduler": "tcp://x:1"})
    assert Engine.from_params(cfg, "validate") == Engine("dask", 2, "tcp://x:1")
    listed = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["validate"]["params"]
    checks = [k for k in ValidateConfig.model_fields if k not in EngineParams.model_fields]
    assert sorted(listed) == sorted([f"validate.{k}" for k in checks] + ["clean.min_chars"])
    with pytest.raises(BertraceError, match="validate.workers"):
        ValidateConfig.from_params({"workers": -1})


def test_local_workers_only_for_enough_rows_and_batches_sized_from_them():
    small = [("train", f"s{i}", {"rows": 2000}) for i in range(100)]  # 200k rows: one process
    assert vs._sized(small, Engine("local", 2)) == (Engine("local", 1), vs.MAX_BATCH_ROWS)
    big = [("train", f"s{i}", {"rows": 2500}) for i in range(400)]  # 1M rows: 2 workers, ~4 batches each
    assert vs._sized(big, Engine("local", 2)) == (Engine("local", 2), 125_000)
    assert vs._sized(small, Engine("dask", 2)) == (Engine("dask", 2), vs.MIN_BATCH_ROWS)  # a cluster: as asked
