"""Fine-tuning: task data (hub mirror / local files, column maps, labels, truncation), the
transplant of pre-trained encoder weights, the three modes, seeds, and the finetune stage end
to end on a tiny model with a tiny tokenizer trained here."""

from __future__ import annotations

import csv
import dataclasses
import json
import re
import statistics

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from pipeline.core.errors import BertraceError
from pipeline.core.io import sha256_file
from pipeline.finetune.encoding import cut, encode_examples, head_tail_split, pair_budget
from pipeline.finetune.loop import (
    FinetuneConfig,
    LengthGroupedBatches,
    build_model,
    finetuned_model_config,
    layer_depth,
    layerwise_lr_groups,
    train_seed,
)
from pipeline.finetune.task_data import load_task_data
from pipeline.models.bert import BertConfig, BertForSequenceClassification, param_groups
from pipeline.models.checkpoint import check_checkpoint_tokenizer, resolve_checkpoint
from pipeline.models.primitives import Dropout
from pipeline.pretrain.schedule import linear_warmup_decay
from tests.conftest import REPO, shared_file
from tests.support.finetuning import synthetic_rows, train_tokenizer, write_csv

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models, one torch thread


# ---------------------------------------------------------------------------------------------
# Task data
# ---------------------------------------------------------------------------------------------
def test_sst2_local_files_label_first_crlf_and_content_column(env, tmp_path):
    train_src = shared_file("sst2", "train.tsv")
    head = train_src.read_bytes().split(b"\n")[:301]  # header + 300 rows, CRLF kept
    train = tmp_path / "train.tsv"
    train.write_bytes(b"\n".join(head) + b"\n")
    assert b"\r\n" in train.read_bytes()
    dev = shared_file("sst2", "dev.tsv")
    task = {
        "source": "local",
        "text_columns": ["sentence"],
        "label_column": "label",
        "label_names": ["negative", "positive"],
        "local": {"train": str(train), "validation": {"path": str(dev), "columns": {"content": "sentence"}}},
    }
    data = load_task_data(task, env["tokenizer"], max_len=64)
    tr, va = data.splits["train"], data.splits["validation"]
    assert (len(tr), len(va)) == (300, 872)
    assert va.label_counts(2) == [428, 444]  # README: dev has 428 label 0, 444 label 1
    assert sum(tr.label_counts(2)) == 300
    # the first train row: "0<TAB>hide new secretions from the parental units" (no stray \r)
    first = env["tokenizer"].encode("hide new secretions from the parental units", add_special_tokens=False).ids
    assert tr.input_ids[0] == [2, *first, 3] and int(tr.labels[0]) == 0
    assert data.files[dev.as_posix()] == "84207e6be5873fb18db798cc6faec86871f5a426554650ff64a1c34e87665f6f"
    assert data.files[train.as_posix()] == sha256_file(train)

    # The dev file read under its own column name needs no rename.
    task2 = {**task, "text_columns": ["content"], "local": {"validation": str(dev)}}
    data2 = load_task_data(task2, env["tokenizer"], max_len=64, roles=("validation",))
    assert data2.splits["validation"].input_ids == va.input_ids


def test_sst2_through_the_mirror_renames_columns_and_test_is_labelled(env):
    shared_file("sst2", "test.tsv")
    mirror = REPO / "mirrors" / "shared-data.yaml"
    data = load_task_data({}, env["tokenizer"], max_len=64, mirror=mirror, roles=("validation", "test"))
    assert data.label_names == ["negative", "positive"] and data.text_columns == ["sentence"]
    assert data.splits["validation"].label_counts(2) == [428, 444]
    assert data.splits["test"].label_counts(2) == [912, 909]  # the local test.tsv is labelled
    assert set(data.files.values()) == {
        "84207e6be5873fb18db798cc6faec86871f5a426554650ff64a1c34e87665f6f",
        "fcd46f967b7b8efd8b5398481dadf873886298d092195167af907fd532e81e1c",
    }
    assert data.source["type"] == "hub" and data.source["dataset"] == "nyu-mll/glue"


def test_hub_source_with_classlabel_names_and_column_renames(env, tmp_path, monkeypatch):
    """The hub code path (datasets.load_dataset), offline: a local dataset folder."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    features = datasets.Features(
        {"review": datasets.Value("string"), "label": datasets.ClassLabel(names=["bad", "good"])}
    )
    folder = tmp_path / "hub-dataset"
    folder.mkdir()
    for split, n in (("train", 40), ("validation", 10)):
        rows = synthetic_rows(n, 3)
        datasets.Dataset.from_dict(
            {"review": [t for t, _ in rows], "label": [y for _, y in rows]}, features=features
        ).to_parquet(str(folder / f"{split}.parquet"))
    task = {"hub": {"dataset": str(folder), "config": None}, "columns": {"review": "sentence"}, "label_names": []}
    data = load_task_data(task, env["tokenizer"], max_len=32)
    assert data.label_names == ["bad", "good"]  # from the ClassLabel feature
    assert (len(data.splits["train"]), len(data.splits["validation"])) == (40, 10)
    assert data.splits["train"].label_counts(2) == [20, 20]
    assert data.source["type"] == "hub" and len(data.files) == 2


def test_imdb_parquet_head_tail_truncation_and_carved_validation(env, tmp_path):
    table = pq.read_table(shared_file("imdb", "train.parquet"))
    sl = pa.concat_tables([table.slice(0, 150), table.slice(12_500, 150)])  # 150 neg + 150 pos
    path = tmp_path / "imdb.parquet"
    pq.write_table(sl, path)
    task = {
        "source": "local",
        "local": {"train": str(path)},
        "text_columns": "text",
        "label_names": ["neg", "pos"],
        "splits": {"validation": None},
        "validation_fraction": 0.2,
    }
    data = load_task_data(task, env["tokenizer"], max_len=64, truncation="head_tail")
    tr, va = data.splits["train"], data.splits["validation"]
    assert (len(tr), len(va)) == (240, 60)
    assert sum(tr.label_counts(2)) + sum(va.label_counts(2)) == 300 and min(va.label_counts(2)) > 10
    assert tr.truncated > 200  # reviews are long
    assert max(len(ids) for ids in tr.input_ids + va.input_ids) == 64
    # head_tail keeps the start and the end of the review (Sun et al. 2019)
    full = env["tokenizer"].encode(sl.column("text")[0].as_py(), add_special_tokens=False).ids
    ids, _, n_cut = encode_examples(env["tokenizer"], [sl.column("text")[0].as_py()], None, 64, "head_tail")
    h = head_tail_split(62)
    assert n_cut == 1 and len(ids[0]) == 64 and h == 15
    assert ids[0] == [2, *full[:h], *full[-(62 - h) :], 3]
    assert head_tail_split(510) == 128  # 128 head + 382 tail at max_len 512
    # validation rows are disjoint from train rows; the split does not depend on anything but the seed
    again = load_task_data(task, env["tokenizer"], max_len=64, truncation="head_tail")
    assert again.splits["validation"].input_ids == va.input_ids
    assert not set(map(tuple, va.input_ids)) & set(map(tuple, tr.input_ids)) - {()}
    # max_examples draws a random subset per role, the same whichever roles are loaded together
    capped = {**task, "max_examples": {"train": 100, "validation": 20}}
    both = load_task_data(capped, env["tokenizer"], max_len=64, truncation="head_tail")
    alone = load_task_data(capped, env["tokenizer"], max_len=64, truncation="head_tail", roles=("validation",))
    assert (len(both.splits["train"]), len(both.splits["validation"])) == (100, 20)
    assert alone.splits["validation"].input_ids == both.splits["validation"].input_ids
    assert set(map(tuple, both.splits["validation"].input_ids)) <= set(map(tuple, va.input_ids))
    assert min(both.splits["train"].label_counts(2)) > 30  # not the first 100 rows (all neg)


def test_sentence_pair_task_with_string_labels(env, tmp_path):
    rows = [
        {"premise": "the movie was good " * (8 if i == 0 else 1), "hypothesis": "a film", "label": lab}
        for i, lab in enumerate(["entailment", "not_entailment", "entailment", "0", 1])
    ]
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    task = {
        "source": "local",
        "local": {"train": str(path), "validation": str(path)},
        "text_columns": ["premise", "hypothesis"],
        "label_names": ["entailment", "not_entailment"],
    }
    data = load_task_data(task, env["tokenizer"], max_len=16)
    tr = data.splits["train"]
    assert tr.labels.tolist() == [0, 1, 0, 0, 1]  # names, digit strings and ints
    ids, types = tr.input_ids[1], tr.token_type_ids[1]
    a = env["tokenizer"].encode("the movie was good", add_special_tokens=False).ids
    b = env["tokenizer"].encode("a film", add_special_tokens=False).ids
    assert ids == [2, *a, 3, *b, 3] and types == [0] * (len(a) + 2) + [1] * (len(b) + 1)
    # the long premise is cut first (longest-first, Google's _truncate_seq_pair); B stays whole
    assert len(tr.input_ids[0]) == 16 and tr.token_type_ids[0].count(1) == len(b) + 1 and tr.truncated == 1
    assert pair_budget(10, 3, 8) == (5, 3) and pair_budget(4, 4, 6) == (3, 3)
    assert cut(list(range(10)), 4, "head") == [0, 1, 2, 3]


def test_labels_outside_label_names_are_an_error(env, tmp_path):
    path = write_csv(tmp_path / "bad.csv", ["text", "label"], [("good", "pos"), ("bad", "maybe"), ("x", "neg")])
    task = {
        "source": "local",
        "local": {"train": str(path), "validation": str(path)},
        "text_columns": ["text"],
        "label_names": ["neg", "pos"],
    }
    with pytest.raises(BertraceError) as e:
        load_task_data(task, env["tokenizer"], max_len=32)
    msg = str(e.value)
    assert str(path) in msg and "'maybe'" in msg and "['neg', 'pos']" in msg and "label_names" in msg
    path2 = write_csv(tmp_path / "bad2.csv", ["text", "label"], [("good", 1), ("bad", 2)])
    with pytest.raises(BertraceError, match=r"bad2\.csv.*outside.*2"):
        load_task_data({**task, "local": {"train": str(path2), "validation": str(path2)}}, env["tokenizer"], max_len=32)


def test_missing_column_lists_the_columns_present(env, tmp_path):
    dev = shared_file("sst2", "dev.tsv")
    task = {
        "source": "local",
        "local": {"validation": str(dev)},
        "text_columns": ["sentence"],
        "label_names": ["negative", "positive"],
    }
    with pytest.raises(BertraceError) as e:
        load_task_data(task, env["tokenizer"], max_len=32, roles=("validation",))
    msg = str(e.value)
    assert str(dev) in msg and "'sentence'" in msg and "['label', 'content']" in msg
    assert "finetune.task.text_columns" in msg


def test_missing_file_and_empty_split_errors(env, tmp_path):
    task = {**env["task"], "local": {"train": str(tmp_path / "nope.tsv"), "validation": str(tmp_path / "nope.tsv")}}
    with pytest.raises(BertraceError, match=r"nope\.tsv: file not found"):
        load_task_data(task, env["tokenizer"], max_len=32)
    empty = write_csv(tmp_path / "empty.csv", ["text", "label"], [])
    with pytest.raises(BertraceError, match=r"empty\.csv: the train split \(train\) has no rows"):
        load_task_data(
            {**env["task"], "local": {"train": str(empty), "validation": str(empty)}}, env["tokenizer"], max_len=32
        )


def test_csv_delimiter_is_sniffed_or_set_and_recorded(env, tmp_path):
    """A semicolon CSV (a spreadsheet export in many locales) no longer fails with a pandas ParserError:
    `delimiter: auto` sniffs it; an explicit delimiter / quoting wins; the choice is in source.tables."""
    rows = [(f'{t}; really, "{i}"', y) for i, (t, y) in enumerate(synthetic_rows(40, 3))]
    semi = tmp_path / "semi.csv"
    with open(semi, "w", newline="", encoding="utf-8") as f:
        csv.writer(f, delimiter=";").writerows([("text", "label"), *rows])
    pipe = tmp_path / "pipe.csv"
    pipe.write_text("text|label\n" + "".join(f"{t}|{y}\n" for t, y in synthetic_rows(40, 4)), encoding="utf-8")
    task = {
        "source": "local",
        "local": {"train": str(semi), "validation": str(pipe)},
        "text_columns": ["text"],
        "label_names": ["neg", "pos"],
    }
    data = load_task_data(task, env["tokenizer"], max_len=64)
    assert len(data.splits["train"]) == len(data.splits["validation"]) == 40
    assert data.source["tables"] == {
        semi.as_posix(): {"delimiter": ";", "quoting": "minimal", "sniffed": True},
        pipe.as_posix(): {"delimiter": "|", "quoting": "minimal", "sniffed": True},
    }
    first = env["tokenizer"].encode(rows[0][0], add_special_tokens=False).ids  # the quoted ';' and '"' kept
    assert data.splits["train"].input_ids[0] == [2, *first, 3]
    # explicit: a tab-separated file named .csv, quotes as plain characters
    tab = tmp_path / "tab.csv"
    tab.write_text("text\tlabel\n" + "".join(f'"{t}\t{y}\n' for t, y in synthetic_rows(10, 5)), encoding="utf-8")
    explicit = {**task, "local": {"train": str(tab), "validation": str(tab)}, "delimiter": "\t", "quoting": "none"}
    data = load_task_data(explicit, env["tokenizer"], max_len=64)
    assert data.source["tables"][tab.as_posix()] == {"delimiter": "\t", "quoting": "none", "sniffed": False}
    assert len(data.splits["train"]) == 10
    # GLUE's .tsv keeps its rule (tab, no quoting) under auto
    from pipeline.finetune.task_files import csv_dialect

    assert csv_dialect(shared_file("sst2", "dev.tsv")) == {"delimiter": "\t", "quoting": "none", "sniffed": False}
    with pytest.raises(BertraceError, match="finetune.task.delimiter"):
        load_task_data({**task, "delimiter": "ab"}, env["tokenizer"], max_len=64)


# ---------------------------------------------------------------------------------------------
# Transplant and modes
# ---------------------------------------------------------------------------------------------
def test_tokenizer_mismatch_names_both_hashes(env, tmp_path):
    other = train_tokenizer(tmp_path / "other.json", ["completely different words here"], vocab_size=120)
    expected, actual = sha256_file(env["tokenizer_path"]), sha256_file(other)
    with pytest.raises(BertraceError) as e:
        check_checkpoint_tokenizer(env["ckpt"], env["ckpt_path"], other)
    assert expected in str(e.value) and actual in str(e.value) and str(env["ckpt_path"]) in str(e.value)
    assert check_checkpoint_tokenizer(env["ckpt"], env["ckpt_path"], env["tokenizer_path"]) == expected


def test_full_loads_encoder_and_scratch_does_not(env):
    sd = env["ckpt"]["model"]
    full = build_model(env["ckpt"], 2, "full", seed=0)
    scratch = build_model(env["ckpt"], 2, "scratch", seed=0)
    encoder_keys = [k for k in full.state_dict() if k.startswith("bert.")]
    assert encoder_keys and all(torch.equal(full.state_dict()[k], sd[k]) for k in encoder_keys)
    differ = [
        k
        for k in encoder_keys
        if k.endswith("weight") and "ln" not in k and not torch.equal(scratch.state_dict()[k], sd[k])
    ]
    assert len(differ) == len([k for k in encoder_keys if k.endswith("weight") and "ln" not in k])
    assert not any(k.startswith(("mlm.", "nsp.")) for k in full.state_dict())  # heads dropped
    assert set(full.state_dict()) == set(scratch.state_dict())
    # same seed, same classifier init in every mode (only the encoder differs)
    assert torch.equal(full.classifier.weight, scratch.classifier.weight)
    assert resolve_checkpoint(env["ckpt_path"].with_name("best.pt")) == env["ckpt_path"]  # falls back to last.pt


def test_encoder_dropout_overrides_the_checkpoint_config(env):
    ckpt_dropout = env["ckpt"]["model_config"]["dropout"]
    kept = build_model(env["ckpt"], 2, "full", seed=0)
    assert kept.config.dropout == ckpt_dropout
    model = build_model(env["ckpt"], 2, "full", encoder_dropout=0.3, seed=0)
    assert model.config.dropout == 0.3 and model.config.attention_dropout == 0.3
    assert {m.p for m in model.bert.modules() if isinstance(m, Dropout)} == {0.3}
    assert model.drop.p == 0.3  # the classifier's follows unless finetune.dropout is set
    same = build_model(env["ckpt"], 2, "full", dropout=0.0, encoder_dropout=0.3, seed=0)
    assert same.drop.p == 0.0
    sd_a, sd_b = model.state_dict(), kept.state_dict()
    assert all(torch.equal(sd_a[k], sd_b[k]) for k in sd_a)  # same weights: only dropout changes
    with pytest.raises(BertraceError, match=r"finetune.encoder_dropout = 1.5: must be < 1"):
        FinetuneConfig.from_params({"encoder_dropout": 1.5})


def test_pooling_is_recorded_in_the_config_of_sequence_classifiers_only(env):
    ckpt = {**env["ckpt"], "model_config": {**env["ckpt"]["model_config"], "classifier_pooling": "mean"}}
    assert "classifier_pooling" not in finetuned_model_config(ckpt, "cls")  # [CLS]: the config as pre-trained
    assert finetuned_model_config(env["ckpt"], "mean")["classifier_pooling"] == "mean"
    assert "classifier_pooling" not in finetuned_model_config(env["ckpt"], "mean", "token_classification")
    mean = build_model(env["ckpt"], 2, "full", pooling="mean", seed=0)
    cls = build_model(env["ckpt"], 2, "full", seed=0)
    assert mean.config.classifier_pooling == "mean" and cls.config.classifier_pooling == "cls"
    sd_m, sd_c = mean.state_dict(), cls.state_dict()
    assert all(torch.equal(sd_m[k], sd_c[k]) for k in sd_m)  # same weights: only what the pooler reads
    with pytest.raises(BertraceError, match=r"finetune.pooling = 'max'"):
        FinetuneConfig.from_params({"pooling": "max"})


def test_layer_lr_decay_lowers_the_rate_towards_the_input(env):
    model = build_model(env["ckpt"], 2, "full", seed=0)
    L = model.config.num_layers
    plain = layerwise_lr_groups(model, 1e-3, 0.01)  # decay 1.0: param_groups' two groups, one lr
    assert [(len(g["params"]), g["weight_decay"], g["lr"]) for g in plain] == [
        (len(g["params"]), g["weight_decay"], 1e-3) for g in param_groups(model, 0.01)
    ]
    groups = layerwise_lr_groups(model, 1e-3, 0.01, decay=0.5)
    lr_of = {id(p): g["lr"] for g in groups for p in g["params"]}
    named = dict(model.named_parameters())
    assert len(lr_of) == len(named)  # every parameter once
    assert lr_of[id(named["bert.embeddings.word.weight"])] == pytest.approx(1e-3 * 0.5 ** (L + 2))
    assert lr_of[id(named["bert.layers.0.attn.qkv.weight"])] == pytest.approx(1e-3 * 0.5 ** (L + 1))
    assert lr_of[id(named[f"bert.layers.{L - 1}.ffn.proj.bias"])] == pytest.approx(1e-3 * 0.5**2)
    assert lr_of[id(named["bert.pooler.weight"])] == lr_of[id(named["classifier.bias"])] == 1e-3
    assert [layer_depth(n, 2) for n in ("gpt.wte.weight", "gpt.blocks.1.mlp.fc.bias", "gpt.ln_f.weight")] == [0, 2, 4]
    decayed = {id(p) for g in groups if g["weight_decay"] for p in g["params"]}
    assert id(named["bert.layers.0.ln_attn.weight"]) not in decayed and id(named["classifier.weight"]) in decayed
    with pytest.raises(BertraceError, match=r"finetune.layer_lr_decay = 1.5: must be <= 1"):
        FinetuneConfig.from_params({"layer_lr_decay": 1.5})


def test_frozen_mode_trains_only_the_classifier(env):
    data = load_task_data(env["task"], env["tokenizer"], max_len=32)
    cfg = FinetuneConfig(mode="frozen", epochs=2, batch_size=32, lr=1e-2, seeds=[0], patience=0)
    model = build_model(env["ckpt"], 2, "frozen", seed=0)
    assert all(not p.requires_grad for p in model.bert.parameters()) and model.classifier.weight.requires_grad
    result = train_seed(env["ckpt"], data, cfg, 0, progress=False)
    sd, pre = result.state_dict, env["ckpt"]["model"]
    encoder = [k for k in sd if k.startswith("bert.")]
    assert all(torch.equal(sd[k], pre[k]) for k in encoder)  # bit-identical after training
    assert not torch.equal(sd["classifier.weight"], model.classifier.weight)  # the probe learned
    assert result.steps == 2 * 7


def test_seeds_are_reproducible_and_batches_cover_every_example(env):
    data = load_task_data(env["task"], env["tokenizer"], max_len=32)
    cfg = FinetuneConfig(epochs=1, batch_size=16, lr=1e-3, patience=0)
    a, b, c = (train_seed(env["ckpt"], data, cfg, seed, progress=False) for seed in (5, 5, 6))
    assert all(torch.equal(a.state_dict[k], b.state_dict[k]) for k in a.state_dict)
    assert a.validation_loss == b.validation_loss and a.history == b.history
    assert not torch.equal(a.state_dict["classifier.weight"], c.state_dict["classifier.weight"])

    lengths = [len(x) for x in data.splits["train"].input_ids]
    sampler = LengthGroupedBatches(lengths, 7, torch.Generator().manual_seed(0), window=3)
    epoch1, epoch2 = list(sampler), list(sampler)
    assert len(epoch1) == len(sampler) == 29  # 9 windows of 21 examples (3 batches each) + 11 left: 2 batches
    assert sorted(i for batch in epoch1 for i in batch) == list(range(200)) and epoch1 != epoch2

    def spread(batches):
        return statistics.fmean(max(lengths[i] for i in bt) - min(lengths[i] for i in bt) for bt in batches)

    perm = torch.randperm(200, generator=torch.Generator().manual_seed(0)).tolist()
    random_batches = [perm[j : j + 7] for j in range(0, 200, 7)]
    assert spread(epoch1) < 0.5 * spread(random_batches)  # similar lengths in a batch: little padding


def test_schedule_and_params():
    f = [linear_warmup_decay(t, warmup=10, total=110, ramp_offset=0) for t in (0, 5, 10, 60, 110)]
    assert f == [0.0, 0.5, 1.0, 0.5, 0.0]  # Google's ramp: the first update at rate 0
    assert linear_warmup_decay(0, warmup=0, total=10, ramp_offset=0) == 1.0
    cfg = FinetuneConfig.from_params({"mode": "frozen", "seeds": 7, "lr": 1e-3, "dropout": None})
    assert cfg.seeds == [7] and cfg.dropout is None and cfg.eps == 1e-6 and cfg.warmup == 0.1
    assert FinetuneConfig.from_params({"seeds": [1, 2, 3]}).seeds == [1, 2, 3]
    assert FinetuneConfig.from_params(yaml.safe_load("lr: 5e-5")).lr == 5e-5  # YAML 1.1 reads 5e-5 as a string
    with pytest.raises(BertraceError, match=r"finetune.learning_rate: unknown key; valid keys: .*clip_grad_norm"):
        FinetuneConfig.from_params({"learning_rate": 1e-3})
    with pytest.raises(
        BertraceError, match=r"finetune.mode = 'partial': input should be 'full', 'frozen' or 'scratch'"
    ):
        FinetuneConfig.from_params({"mode": "partial"})
    with pytest.raises(BertraceError, match=r"finetune.seeds = \[1, 1\]: repeats a seed"):
        FinetuneConfig.from_params({"seeds": [1, 1]})
    with pytest.raises(BertraceError, match=r"finetune.warmup_ratio: unknown key"):  # renamed: warmup, as in pretrain
        FinetuneConfig.from_params({"warmup_ratio": 0.1})


# ---------------------------------------------------------------------------------------------
# The stage, end to end
# ---------------------------------------------------------------------------------------------
def test_finetune_stage_end_to_end(env, tmp_path, monkeypatch):
    import mlflow

    import stages.finetune as stage

    root = tmp_path / "repo"
    (root / "data" / "tokenizer").mkdir(parents=True)
    (root / "data" / "pretrain").mkdir(parents=True)
    (root / "data" / "tokenizer" / "tokenizer.json").write_bytes(env["tokenizer_path"].read_bytes())
    # only last.pt exists: the stage falls back to it from data/pretrain/best.pt
    (root / "data" / "pretrain" / "last.pt").write_bytes(env["ckpt_path"].read_bytes())
    params = {
        "compute": {"kernels": "portable"},
        "finetune": {
            "checkpoint": "data/pretrain/best.pt",
            "tokenizer": "data/tokenizer/tokenizer.json",
            "mirror": "",
            "task": env["task"],
            "mode": "full",
            "max_len": 32,
            "truncation": "head",
            "epochs": 6,
            "batch_size": 16,
            "lr": 3e-3,
            "warmup": 0.1,
            "weight_decay": 0.01,
            "dropout": 0.1,
            "patience": 3,
            "seeds": [1, 2],
            "threads": 0,
        },
    }
    (root / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    monkeypatch.chdir(root)
    monkeypatch.delenv("BERTRACE_HUB_MIRROR", raising=False)
    metrics = stage.main(progress=False)

    # metrics: per seed and mean ± std
    saved = json.loads((root / "reports" / "finetune.json").read_text())
    assert saved["n_seeds"] == 2 and set(saved["per_seed"]) == {"1", "2"}
    accs = [saved["per_seed"][s]["validation_accuracy"] for s in ("1", "2")]
    assert saved["validation_accuracy"]["mean"] == pytest.approx(statistics.fmean(accs))
    assert saved["validation_accuracy"]["std"] == pytest.approx(statistics.stdev(accs))
    losses = [saved["per_seed"][s]["validation_loss"] for s in ("1", "2")]
    assert losses[0] != losses[1]  # the seeds really are different runs
    assert saved["validation_loss"]["std"] == pytest.approx(statistics.stdev(losses))
    assert min(accs) > 0.8, accs  # a keyword task: far better than the 0.5 of chance
    assert saved["examples"] == {"train": 200, "validation": 100}
    assert not _time_keys(saved)  # timings: the run log's
    timings = json.loads((root / "runs" / "finetune.json").read_text())["timings"]
    assert timings["cpu_minutes"] > 0 and timings["wall_minutes"] > 0 and set(timings["per_seed"]) == {"1", "2"}
    assert timings["per_seed"]["1"]["wall_seconds"] > 0 and timings["wall_seconds"] > 0
    assert metrics["best_seed"] == saved["best_seed"] == (1 if accs[0] >= accs[1] else 2)

    # the checkpoint: SPEC format, weights_only-loadable, the best seed's model
    ckpt = torch.load(root / "data" / "finetune" / "model.pt", weights_only=True)
    for key in (
        "model",
        "model_config",
        "num_labels",
        "label_names",
        "task",
        "tokenizer_sha256",
        "mode",
        "seed",
        "metrics",
        "provenance",
    ):
        assert key in ckpt, key
    assert ckpt["num_labels"] == 2 and ckpt["label_names"] == ["neg", "pos"] and ckpt["mode"] == "full"
    assert ckpt["task"]["text_columns"] == ["text"] and ckpt["task"]["max_len"] == 32
    assert ckpt["task"]["truncation"] == "head" and ckpt["seed"] == saved["best_seed"]
    assert ckpt["metrics"]["validation_accuracy"] == max(accs)
    tok_sha = sha256_file(env["tokenizer_path"])
    assert ckpt["tokenizer_sha256"] == tok_sha == sha256_file(root / "data" / "finetune" / "tokenizer.json")
    prov = ckpt["provenance"]
    assert prov["pretrain"]["tokenizer_sha256"] == tok_sha and prov["params"]["mode"] == "full"
    assert prov["params_hash"] and not {"git", "started", "finished", "seconds", "code"} & set(prov)
    # (prov["pretrain"] is the pre-training checkpoint's own provenance, as it wrote it)
    assert not _time_keys(ckpt["metrics"]) and not _time_keys({k: v for k, v in prov.items() if k != "pretrain"})
    assert prov["pretrain_checkpoint_sha256"] == sha256_file(env["ckpt_path"])
    assert set(prov["task_files"].values()) == {
        sha256_file(env["task"]["local"]["train"]),
        sha256_file(env["task"]["local"]["validation"]),
    }
    # the pre-training config plus the pooling the stage fine-tuned with (finetune.pooling's default)
    expected = dataclasses.replace(BertConfig.from_dict(env["ckpt"]["model_config"]), classifier_pooling="mean")
    assert BertConfig.from_dict(ckpt["model_config"]) == expected

    # it loads strictly and reproduces the reported validation accuracy
    model = BertForSequenceClassification(BertConfig.from_dict(ckpt["model_config"]), ckpt["num_labels"])
    model.load_state_dict(ckpt["model"])
    from pipeline.finetune.loop import evaluate_split

    data = load_task_data(env["task"], env["tokenizer"], max_len=32)
    assert evaluate_split(model, data.splits["validation"])["accuracy"] == pytest.approx(max(accs))

    # provenance record with the pre-training provenance upstream
    record = json.loads((root / "data" / "provenance" / "finetune.json").read_text())
    assert record["stage"] == "finetune" and record["upstream"]["pretrain"]["tokenizer_sha256"] == tok_sha
    assert record["outputs"]["data/finetune/model.pt"] == sha256_file(root / "data" / "finetune" / "model.pt")
    assert record["inputs"]["data/pretrain/last.pt"] == sha256_file(env["ckpt_path"])

    # MLflow: one parent run, one nested run per seed with the tags
    client = mlflow.tracking.MlflowClient()
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 2
    assert {r.data.tags["bertrace.seed"] for r in children} == {"1", "2"}
    for r in children:
        assert r.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert r.data.tags["bertrace.stage"] == "finetune" and r.data.tags["bertrace.mode"] == "full"
        assert r.data.tags["bertrace.tokenizer_sha256"] == tok_sha
        assert r.data.tags["bertrace.pretrain_checkpoint_sha256"] == sha256_file(env["ckpt_path"])
        assert (
            r.data.metrics["best_validation_accuracy"]
            == saved["per_seed"][r.data.tags["bertrace.seed"]]["validation_accuracy"]
        )
    assert parents[0].data.metrics["validation_accuracy.mean"] == pytest.approx(saved["validation_accuracy"]["mean"])


_TIME_KEYS = re.compile(r"seconds|minutes|started|finished|_per_s$|^date$|^host$|^git$|run_id$")


def _time_keys(obj, path="") -> list[str]:
    """Key paths in ``obj`` (at any depth) that name a time, a duration, a throughput, a host, a commit or a run."""
    if isinstance(obj, dict):
        return [
            p
            for k, v in obj.items()
            for p in ([f"{path}/{k}"] if _TIME_KEYS.search(str(k)) else []) + _time_keys(v, f"{path}/{k}")
        ]
    if isinstance(obj, list):
        return [p for i, v in enumerate(obj) for p in _time_keys(v, f"{path}/{i}")]
    return []


def test_fine_tuning_twice_gives_byte_identical_outputs(env, tmp_path, monkeypatch):
    """The same checkpoint, task files and params fine-tuned in two directories (as two machines would):
    model.pt, reports/finetune.json and metrics/finetune.json have the same bytes, so dvc.lock does not
    change; the run logs, which hold the times, differ."""
    import stages.finetune as stage

    monkeypatch.setenv("BERTRACE_NO_MLFLOW", "1")
    monkeypatch.delenv("BERTRACE_HUB_MIRROR", raising=False)
    outputs = (
        "data/finetune/model.pt",
        "data/finetune/tokenizer.json",
        "reports/finetune.json",
        "metrics/finetune.json",
    )
    digests, logs = [], []
    for name in ("a", "b"):
        root = tmp_path / name
        (root / "data" / "tokenizer").mkdir(parents=True)
        (root / "data" / "pretrain").mkdir(parents=True)
        (root / "data" / "tokenizer" / "tokenizer.json").write_bytes(env["tokenizer_path"].read_bytes())
        (root / "data" / "pretrain" / "best.pt").write_bytes(env["ckpt_path"].read_bytes())
        for role in ("train", "validation"):
            (root / f"{role}.csv").write_bytes(open(env["task"]["local"][role], "rb").read())
        task = {**env["task"], "local": {"train": "train.csv", "validation": "validation.csv"}}
        params = {
            "compute": {"kernels": "portable"},
            "finetune": {
                "checkpoint": "data/pretrain/best.pt",
                "tokenizer": "data/tokenizer/tokenizer.json",
                "task": task,
                "max_len": 32,
                "epochs": 2,
                "batch_size": 16,
                "lr": 3e-3,
                "seeds": [1, 2],
                "threads": 1,
            },
        }
        (root / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
        monkeypatch.chdir(root)
        stage.main(progress=False)
        digests.append({p: sha256_file(root / p) for p in outputs})
        logs.append(json.loads((root / "runs" / "finetune.json").read_text()))
        saved = json.loads((root / "reports" / "finetune.json").read_text())
        ckpt = torch.load(root / outputs[0], weights_only=True)
        ckpt["provenance"].pop("pretrain")  # the pre-training checkpoint's own provenance, as it wrote it
        assert not _time_keys(saved) and not _time_keys(ckpt)
    assert digests[0] == digests[1]
    assert logs[0]["timings"]["per_seed"].keys() == {"1", "2"} and logs[0]["timings"] != logs[1]["timings"]


def test_probe_script_fine_tunes_each_variant(env, tmp_path):
    """bench/probe_finetune.py: params.yaml's finetune section + overrides per variant on one checkpoint;
    a row of dev accuracy per variant, equal to what the stage's own fine-tuning gives for that recipe."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("probe_ft", REPO / "bench" / "probe_finetune.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    base = {
        "task": env["task"],
        "mode": "full",
        "max_len": 32,
        "epochs": 2,
        "batch_size": 16,
        "lr": 3e-3,
        "patience": 0,
        "seeds": [0, 1],
        "mirror": "",
    }
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"compute": {"kernels": "portable"}, "finetune": base}))
    rows = probe.main(
        [
            "--checkpoint",
            str(env["ckpt_path"]),
            "--tokenizer",
            str(env["tokenizer_path"]),
            "--params",
            str(params),
            "--seeds",
            "3",
            "--variant",
            "",
            "--variant",
            "mode=scratch,max_len=16",
            "--json",
            str(tmp_path / "rows.json"),
        ]
    )
    assert [r["variant"] for r in rows] == ["params.yaml", "mode=scratch,max_len=16"]
    assert json.loads((tmp_path / "rows.json").read_text()) == rows
    assert all(r["seeds"] == [3] and set(r["per_seed"]) == {"3"} and r["dev_std"] == 0 for r in rows)
    # the first row is the plain recipe: the same number train_seed gives for seed 3
    cfg = FinetuneConfig.from_params({**base, "seeds": [3]})
    direct = train_seed(env["ckpt"], load_task_data(env["task"], env["tokenizer"], max_len=32), cfg, 3, progress=False)
    assert rows[0]["dev_mean"] == round(100 * direct.validation_accuracy, 2)
    assert rows[0]["checks"]["3"] == [round(100 * h["validation_accuracy"], 2) for h in direct.history]
    assert len(rows[0]["checks"]["3"]) == 2 and rows[0]["dev_mean"] == max(rows[0]["checks"]["3"])  # one per epoch
    with pytest.raises(BertraceError, match="--variant 'lr=0'"):
        probe.main(
            [
                "--checkpoint",
                str(env["ckpt_path"]),
                "--tokenizer",
                str(env["tokenizer_path"]),
                "--params",
                str(params),
                "--variant",
                "lr=0",
            ]
        )


def test_a_variant_lays_its_keys_over_finetune():
    """params.yaml finetune_variants.<name>: nested task keys merge, others replace; unknown keys and
    the checkpoint / tokenizer (DVC deps every variant shares) are errors naming the key."""
    from pipeline.finetune.loop import variant_params

    base = {
        "mode": "full",
        "lr": 1e-4,
        "task": {"type": "classification", "max_examples": {"train": None}},
        "checkpoint": "data/pretrain/best.pt",
    }
    out = variant_params(base, {"mode": "frozen", "lr": 1e-3, "task": {"max_examples": {"train": 100}}}, "frozen")
    assert out == {
        "mode": "frozen",
        "lr": 1e-3,
        "task": {"type": "classification", "max_examples": {"train": 100}},
        "checkpoint": "data/pretrain/best.pt",
    }
    assert base["mode"] == "full" and base["task"]["max_examples"]["train"] is None  # not modified
    assert variant_params(base, None, "same") == base
    with pytest.raises(BertraceError, match=r"finetune_variants\.frozen\.lrr: not a finetune key; use one of"):
        variant_params(base, {"lrr": 1}, "frozen")
    with pytest.raises(BertraceError, match=r"finetune_variants\.x\.checkpoint: every variant fine-tunes"):
        variant_params(base, {"checkpoint": "other.pt"}, "x")
    with pytest.raises(BertraceError, match=r"finetune_variants\.x: expected a mapping"):
        variant_params(base, "frozen", "x")
