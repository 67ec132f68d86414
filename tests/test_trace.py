"""`bertrace trace`: lineage of a checkpoint / provenance record, verification, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pipeline import trace
from pipeline.errors import BertraceError
from pipeline.io import sha256_file
from pipeline.provenance import hash_path, params_hash
from stages import trace as trace_cli

COMMIT = "c0ffee" * 6 + "abcd"


def _record(stage, params, inputs, outputs, upstream=None, dirty=False, **extra):
    rec = {"record_version": 1, "stage": stage,
           "git": {"commit": COMMIT, "dirty": dirty, "dirty_paths": ["x.py"] if dirty else []},
           "params": params, "params_hash": params_hash(params),
           "inputs": inputs, "outputs": outputs, "upstream": upstream or {},
           "libraries": {}, "pipeline_run_id": "run1", "mlflow_run_id": None,
           "started": "2026-01-01T00:00:00+00:00", "finished": f"2026-01-01T00:00:0{len(stage) % 10}+00:00"}
    rec.update(extra)
    return rec


def _write(root: Path, rel: str, text: str) -> str:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return rel


@pytest.fixture
def chain(tmp_path):
    """A small fake pipeline run in tmp_path: files, provenance records, two checkpoints."""
    root = tmp_path
    _write(root, "data/raw/wiki.train.raw", "raw text\n")
    _write(root, "data/clean/train.txt", "clean text\n")
    _write(root, "data/tokenizer/tokenizer.json", '{"vocab": 1}')
    _write(root, "data/tokenizer/vocab.txt", "[PAD]\n[UNK]\n")
    _write(root, "data/examples/manifest.json", '{"shards": 1}')
    h = lambda rel: hash_path(root / rel)  # noqa: E731
    download = _record("download", {"n": 1}, {}, {"data/raw": h("data/raw")})
    clean = _record("clean", {"min": 2}, {"data/raw": h("data/raw")}, {"data/clean/train.txt": h("data/clean/train.txt")},
                    {"download": download})
    tok = _record("tokenizer", {"vocab": 100}, {"data/clean/train.txt": h("data/clean/train.txt")},
                  {"data/tokenizer/tokenizer.json": h("data/tokenizer/tokenizer.json"),
                   "data/tokenizer/vocab.txt": h("data/tokenizer/vocab.txt")}, {"clean": clean})
    ex = _record("examples", {"seq": 32}, {"data/clean/train.txt": h("data/clean/train.txt"),
                                          "data/tokenizer/tokenizer.json": h("data/tokenizer/tokenizer.json")},
                 {"data/examples/manifest.json": h("data/examples/manifest.json")},
                 {"clean": clean, "tokenizer": tok})
    pre = _record("pretrain", {"lr": 1e-3}, {"data/examples/manifest.json": h("data/examples/manifest.json")}, {},
                  {"examples": ex}, dirty=True, tokenizer_sha256=h("data/tokenizer/tokenizer.json"),
                  examples_manifest_sha256=h("data/examples/manifest.json"), device="cpu")
    prov = root / "data/provenance"
    prov.mkdir(parents=True)
    for rec in (download, clean, tok, ex):
        (prov / f"{rec['stage']}.json").write_text(json.dumps(rec))
    best = root / "data/pretrain/best.pt"
    best.parent.mkdir(parents=True)
    torch.save({"format": "bertrace-pretrain-checkpoint", "version": 1, "model": {"w": torch.zeros(2)},
                "model_config": {"hidden": 2}, "provenance": pre}, best)
    ft = _record("finetune", {"epochs": 1}, {"data/pretrain/best.pt": sha256_file(best),
                                             "data/tokenizer/tokenizer.json": h("data/tokenizer/tokenizer.json")}, {},
                 pretrain=pre, pretrain_checkpoint_sha256=sha256_file(best))
    model = root / "data/finetune/model.pt"
    model.parent.mkdir(parents=True)
    torch.save({"format": "x", "model": {"w": torch.zeros(2)}, "model_config": {"hidden": 2}, "num_labels": 2,
                "provenance": ft}, model)
    return root


def test_lineage_order_and_content(chain):
    lin = trace.lineage(chain / "data/finetune/model.pt")
    assert lin["kind"] == "fine-tuned checkpoint"
    assert [n["stage"] for n in lin["chain"]] == ["finetune", "pretrain", "examples", "tokenizer", "clean", "download"]
    pre = lin["chain"][1]
    assert pre["git_commit"] == COMMIT and pre["git_dirty"] is True
    assert pre["params_hash"] == params_hash({"lr": 1e-3})
    tok = lin["chain"][3]
    assert tok["outputs"]["data/tokenizer/vocab.txt"] == hash_path(chain / "data/tokenizer/vocab.txt")
    assert lin["conflicts"] == []

    text = trace.format_tree(lin)
    order = [text.index(f"└─ {s} ") for s in ("finetune", "pretrain", "examples", "tokenizer", "clean", "download")]
    assert order == sorted(order)
    assert "pretrain  commit c0ffeec0ffee (dirty)" in text
    assert "finetune  commit c0ffeec0ffee  params" in text  # clean tree: no "(dirty)"
    assert hash_path(chain / "data/tokenizer/vocab.txt")[:12] in text

    # a pre-training checkpoint and a provenance record start further up the chain
    assert [n["stage"] for n in trace.lineage(chain / "data/pretrain/best.pt")["chain"]][0] == "pretrain"
    assert trace.lineage(chain / "data/pretrain/best.pt")["kind"] == "pre-training checkpoint"
    lin_tok = trace.lineage(chain / "data/provenance/tokenizer.json")
    assert lin_tok["kind"] == "provenance record"
    assert [n["stage"] for n in lin_tok["chain"]] == ["tokenizer", "clean", "download"]


def test_json_round_trip(chain, capsys, monkeypatch):
    monkeypatch.chdir(chain)
    assert trace_cli.main(["data/finetune/model.pt", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == trace.lineage("data/finetune/model.pt")
    assert trace.format_tree(out) == trace.format_tree(trace.lineage("data/finetune/model.pt"))


def test_verify_ok(chain, capsys):
    assert trace_cli.main([str(chain / "data/finetune/model.pt"), "--verify", "--root", str(chain)]) == 0
    text = capsys.readouterr().out
    assert "verify: 12 ok, 0 changed, 0 missing" in text
    lin = trace.lineage(chain / "data/finetune/model.pt")
    results = trace.verify(lin, chain)
    assert results and all(r["status"] == "ok" for r in results)
    assert {r["path"] for r in results} >= {"data/raw", "data/tokenizer/vocab.txt", "data/pretrain/best.pt"}


def test_tampered_file_is_changed_and_fails(chain, capsys):
    vocab = chain / "data/tokenizer/vocab.txt"
    before = hash_path(vocab)
    vocab.write_text("[PAD]\n[UNK]\n[EVIL]\n")
    lin = trace.lineage(chain / "data/finetune/model.pt")
    bad = [r for r in trace.verify(lin, chain) if r["status"] != "ok"]
    assert bad == [{"stage": "tokenizer", "role": "output", "path": "data/tokenizer/vocab.txt",
                    "recorded": before, "actual": hash_path(vocab), "status": "changed"}]
    with pytest.raises(SystemExit) as e:
        trace_cli.main([str(chain / "data/finetune/model.pt"), "--verify", "--root", str(chain)])
    assert e.value.code == 1
    text = capsys.readouterr().out
    assert f"changed (now {hash_path(vocab)[:12]})" in text and before[:12] in text
    # --json carries the same verdict
    with pytest.raises(SystemExit):
        trace_cli.main([str(chain / "data/finetune/model.pt"), "--verify", "--json", "--root", str(chain)])
    out = json.loads(capsys.readouterr().out)
    assert out["summary"]["changed"] == 1


def test_deleted_data_is_missing_not_failure(chain, capsys):
    import shutil

    shutil.rmtree(chain / "data/raw")
    lin = trace.lineage(chain / "data/finetune/model.pt")
    missing = [r for r in trace.verify(lin, chain) if r["status"] == "missing"]
    assert {(r["stage"], r["role"]) for r in missing} == {("clean", "input"), ("download", "output")}
    assert all(r["path"] == "data/raw" and r["actual"] is None for r in missing)
    assert trace_cli.main([str(chain / "data/finetune/model.pt"), "--verify", "--root", str(chain)]) == 0
    text = capsys.readouterr().out
    assert "verify: 10 ok, 0 changed, 2 missing" in text  # one path, recorded by two stages
    assert "data/raw  " in text and "missing" in text


def test_corrupt_or_missing_target_is_a_clear_error(chain, capsys):
    model = chain / "data/finetune/model.pt"
    model.write_bytes(model.read_bytes()[:50])
    with pytest.raises(BertraceError, match="model.pt: not a readable checkpoint"):
        trace.lineage(model)
    with pytest.raises(BertraceError, match="not found"):
        trace.lineage(chain / "nope.pt")
    bad_json = chain / "data/provenance/clean.json"
    bad_json.write_text("{not json")
    with pytest.raises(BertraceError, match="clean.json: not valid JSON"):
        trace.lineage(bad_json)
    no_prov = chain / "plain.pt"
    torch.save({"model": {}, "model_config": {}}, no_prov)
    with pytest.raises(BertraceError, match="no provenance record"):
        trace.lineage(no_prov)
    # through run_stage: one line on stderr, exit 2, no traceback
    from stages.common import run_stage

    with pytest.raises(SystemExit) as e:
        run_stage(lambda: trace_cli.main([str(model)]))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err
