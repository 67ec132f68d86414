"""`bertrace trace`: lineage of a checkpoint, provenance record, export or MLflow run/model;
verification of every link (files, cross-links, params, DVC cache); the CLI."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import mlflow
import pytest
import torch
import yaml

from pipeline.core.arithmetic import host_line, host_specific_reasons
from pipeline.core.device import cpu_model
from pipeline.core.errors import BertraceError
from pipeline.core.io import sha256_file
from pipeline.lineage import trace, trace_render, trace_verify
from pipeline.lineage.provenance import hash_path, params_hash, record_digest
from pipeline.lineage.runlog import RUN_FIELDS
from stages.cli import trace as trace_cli

COMMIT = "c0ffee" * 6 + "abcd"


def _record(stage, params, inputs, outputs, upstream=None, dirty=False, **extra):
    rec = {
        "record_version": 1,
        "stage": stage,
        "git": {"commit": COMMIT, "dirty": dirty, "dirty_paths": ["x.py"] if dirty else []},
        "params": params,
        "params_hash": params_hash(params),
        "inputs": inputs,
        "outputs": outputs,
        "upstream": upstream or {},
        "libraries": {},
        "pipeline_run_id": "run1",
        "mlflow_run_id": None,
        "started": "2026-01-01T00:00:00+00:00",
        "finished": f"2026-01-01T00:00:0{len(stage) % 10}+00:00",
    }
    rec.update(extra)
    return rec


def _cache_put(root: Path, data: bytes, suffix: str = "") -> str:
    """Store ``data`` in root's DVC cache (DVC 3 layout); returns its md5 (+ suffix)."""
    md5 = hashlib.md5(data).hexdigest() + suffix
    p = root / ".dvc/cache/files/md5" / md5[:2] / md5[2:]
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return md5


def _write(root: Path, rel: str, text: str) -> str:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return rel


@pytest.fixture
def chain(tmp_path):
    """A small fake pipeline run in tmp_path: files, provenance records, two checkpoints."""
    return _build_chain(tmp_path)


def _build_chain(root: Path) -> Path:
    _write(root, "data/raw/wiki.train.raw", "raw text\n")
    _write(root, "data/clean/train.txt", "clean text\n")
    _write(root, "data/tokenizer/tokenizer.json", '{"vocab": 1}')
    _write(root, "data/tokenizer/vocab.txt", "[PAD]\n[UNK]\n")
    if not (root / "data/examples/manifest.json").exists():  # shard_chain: a real examples directory
        _write(root, "data/examples/manifest.json", '{"shards": 1}')
    h = lambda rel: hash_path(root / rel)  # noqa: E731
    download = _record("download", {"n": 1}, {}, {"data/raw": h("data/raw")})
    clean = _record(
        "clean",
        {"min": 2},
        {"data/raw": h("data/raw")},
        {"data/clean/train.txt": h("data/clean/train.txt")},
        {"download": download},
    )
    tok = _record(
        "tokenizer",
        {"vocab": 100},
        {"data/clean/train.txt": h("data/clean/train.txt")},
        {
            "data/tokenizer/tokenizer.json": h("data/tokenizer/tokenizer.json"),
            "data/tokenizer/vocab.txt": h("data/tokenizer/vocab.txt"),
        },
        {"clean": clean},
    )
    # the tokenizer output as DVC cached it; the examples stage recorded dvc.lock's md5 for it
    listing = [
        {"md5": _cache_put(root, (root / "data/tokenizer" / n).read_bytes()), "relpath": n}
        for n in ("tokenizer.json", "vocab.txt")
    ]
    tok_md5 = _cache_put(root, json.dumps(listing).encode(), ".dir")
    ex = _record(
        "examples",
        {"seq": 32},
        {
            "data/clean/train.txt": h("data/clean/train.txt"),
            "data/tokenizer/tokenizer.json": h("data/tokenizer/tokenizer.json"),
        },
        {"data/examples/manifest.json": h("data/examples/manifest.json")},
        {"clean": clean, "tokenizer": tok},
        dvc_lock={"tokenizer": {"outs": {"data/tokenizer": tok_md5}, "deps": {}}},
    )
    pre = _record(
        "pretrain",
        {"lr": 1e-3},
        {"data/examples/manifest.json": h("data/examples/manifest.json")},
        {},
        {"examples": ex},
        dirty=True,
        tokenizer_sha256=h("data/tokenizer/tokenizer.json"),
        examples_manifest_sha256=h("data/examples/manifest.json"),
        device="cpu",
    )
    prov = root / "data/provenance"
    prov.mkdir(parents=True)
    for rec in (download, clean, tok, ex):
        (prov / f"{rec['stage']}.json").write_text(json.dumps(rec))
    best = root / "data/pretrain/best.pt"
    best.parent.mkdir(parents=True)
    torch.save(
        {
            "format": "bertrace-pretrain-checkpoint",
            "version": 1,
            "model": {"w": torch.zeros(2)},
            "model_config": {"hidden": 2},
            "provenance": pre,
        },
        best,
    )
    (prov / "pretrain.json").write_text(json.dumps({**pre, "outputs": {"data/pretrain/best.pt": sha256_file(best)}}))
    ft = _record(
        "finetune",
        {"epochs": 1},
        {
            "data/pretrain/best.pt": sha256_file(best),
            "data/tokenizer/tokenizer.json": h("data/tokenizer/tokenizer.json"),
        },
        {},
        pretrain=pre,
        pretrain_checkpoint_sha256=sha256_file(best),
    )
    model = root / "data/finetune/model.pt"
    model.parent.mkdir(parents=True)
    torch.save(
        {
            "format": "x",
            "model": {"w": torch.zeros(2)},
            "model_config": {"hidden": 2},
            "num_labels": 2,
            "provenance": ft,
        },
        model,
    )
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

    text = trace_render.format_tree(lin)
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


def test_download_source_names_the_hub_id_and_revision():
    hub = {"dataset": "Salesforce/wikitext", "config": "wikitext-2-raw-v1", "revision": "main"}
    assert (
        trace.corpus_source({"params": {"source": "hub", "hub": hub}, "mirror": "m.yaml"})
        == "hub Salesforce/wikitext wikitext-2-raw-v1 @ main (through the mirror m.yaml)"
    )
    resolved = {"type": "hub", **hub, "resolved_revision": "b08601e"}  # a record that keeps the manifest's source
    assert (
        trace.corpus_source({"params": {"source": "hub", "hub": hub}, "source": resolved})
        == "hub Salesforce/wikitext wikitext-2-raw-v1 @ b08601e"
    )
    assert (
        trace.corpus_source({"params": {"source": "local", "local": {"path": "data/sources"}}, "mirror": "m"})
        == "local data/sources"
    )


def _no_accelerator(monkeypatch):
    """``device: auto`` resolves to the CPU here, as on CI (the fixture's pre-training ran on it)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    if getattr(torch.backends, "mps", None) is not None:
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


def test_json_round_trip(chain, capsys, monkeypatch):
    _no_accelerator(monkeypatch)
    monkeypatch.chdir(chain)
    assert trace_cli.main(["data/finetune/model.pt", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out.pop("this_machine")[0].startswith("this machine: pretrain here")  # below
    assert out == trace.lineage("data/finetune/model.pt")
    assert trace_render.format_tree(out) == trace_render.format_tree(trace.lineage("data/finetune/model.pt"))


def test_trace_says_whether_this_machine_recomputes_the_weights(chain, capsys, monkeypatch):
    """Pre-training's bytes depend on device, precision (``auto``: bf16 only on a CPU with bf16
    instructions), torch build and CPU threads: trace shows what the run used and whether a rerun
    here would match, naming each difference."""
    _no_accelerator(monkeypatch)
    threads = torch.get_num_threads()
    native = {
        "kernels": "native",
        "cpu_capability": "AVX512",
        "device": "cpu",
        "precision": "bf16",
        "threads": threads,
        "threads_fixed": True,
        "machine": "x86_64",
        "cpu": cpu_model(),
    }
    native["host_specific"] = host_specific_reasons(native)
    ran = {
        "device": "cpu",
        "precision": "bf16",
        "torch": torch.__version__,
        "world_size": 1,
        "determinism": {"deterministic": True, "num_threads": threads},
        "platform": {"machine": "x86_64", "system": "Linux"},
        "arithmetic": native,
    }
    params = {"device": "cpu", "precision": "auto", "num_threads": 0}
    node = {"stage": "pretrain", "params": params, "inputs": {}, "outputs": {}, "compute": trace._compute(ran)}
    lin = {"target": "best.pt", "kind": "pre-training checkpoint", "chain": [node]}
    assert (
        "computed on cpu (x86_64 Linux), bf16 autocast, torch "
        f"{torch.__version__}, {threads} CPU thread" in trace_render.format_tree(lin)
    )
    assert "native kernels (AVX512)" in trace_render.format_tree(lin)
    monkeypatch.setenv("BERTRACE_CPU_BF16", "1")  # a CPU with bf16 instructions: the same run
    assert trace_render.compute_differences(node["compute"], params) == ([], [])
    # host-specific arithmetic from another kind of CPU: only such a host rebuilds it
    elsewhere = trace._compute({**ran, "arithmetic": {**native, "cpu": "AMD EPYC 9B14"}})
    assert trace_render.compute_differences(elsewhere, params)[0] == [
        "host-specific arithmetic (compute.kernels native (AVX512 kernels), bf16 autocast): rebuild on a "
        f"AMD EPYC 9B14 host; this one is a {cpu_model()}"
    ]
    # portable arithmetic: auto is fp32 under the pins, and any x86-64 CPU with AVX2 rebuilds it
    portable = {**native, "kernels": "portable", "cpu_capability": "AVX2", "precision": "fp32", "host_specific": []}
    portable.pop("cpu")
    fp32 = trace._compute({**ran, "precision": "fp32", "arithmetic": portable})
    assert trace_render.compute_differences(fp32, {**params, "num_threads": threads}) == ([], [])
    assert trace_render.this_machine({"chain": [{**node, "compute": fp32}]})[0].endswith(
        "portable kernels: the same bytes"
    )
    assert host_line(portable).startswith("portable arithmetic: fp32 on AVX2 kernels")
    assert trace_render.this_machine(lin)[0].startswith(
        "this machine: pretrain here matches the record's device, precision"
    )
    monkeypatch.setenv("BERTRACE_CPU_BF16", "0")  # without: auto trains fp32 here
    diffs, _ = trace_render.compute_differences(node["compute"], params)
    assert diffs == [
        "precision auto gives fp32 here (this CPU has no bf16 instructions: AVX512-BF16, AMX or "
        "Arm BF16), bf16 when recorded"
    ]
    explicit = {**params, "precision": "bf16"}  # asked for: emulated, not the recorded rounding
    assert "bf16 is emulated on this CPU" in trace_render.compute_differences(node["compute"], explicit)[0][0]
    other = trace._compute({**ran, "precision": "fp32", "torch": "2.0.0", "determinism": {"num_threads": threads + 1}})
    assert trace_render.compute_differences(other, params)[0] == [
        f"{threads} CPU threads here, {threads + 1} when recorded (pretrain.num_threads: {threads + 1} runs with as many)",
        f"torch {torch.__version__} here, 2.0.0 when recorded",
    ]
    assert trace_render.compute_differences(other, {**params, "num_threads": threads + 1})[0] == [
        f"torch {torch.__version__} here, 2.0.0 when recorded"
    ]
    lines = trace_render.this_machine({"chain": [{**node, "compute": other}]})
    assert lines[0] == "this machine: `dvc repro` of pretrain here gives other weights than recorded:"
    assert lines[1].startswith(f"   {threads} CPU threads here") and len(lines) == 3
    assert trace_render.compute_differences({**node["compute"], "device": "cuda:0"}, {"device": "auto"})[0] == [
        "device cpu here, cuda when recorded"
    ]
    # a stage record (data/provenance/pretrain.json) names no precision: trace says it cannot tell
    monkeypatch.chdir(chain)
    assert trace_cli.main(["data/provenance/pretrain.json"]) == 0
    out = capsys.readouterr().out
    assert "computed on cpu, precision not recorded, torch ?" in out
    assert "the record does not say what it gave (reports/pretrain.json does)" in out
    assert "cannot tell: which CPU kernels it ran is not recorded here" in out
    assert "\n   cannot tell: precision auto gives fp32 here" in out


STAGES = ["finetune", "pretrain", "examples", "tokenizer", "clean", "download"]


def test_verify_ok(chain, capsys):
    assert trace_cli.main([str(chain / "data/finetune/model.pt"), "--verify", "--root", str(chain)]) == 0
    text = capsys.readouterr().out
    # 12 file hashes + 6 cross-links (each input vs the upstream's recorded output) + 1 DVC cache object
    assert "verify: 19 ok, 0 changed, 0 not present" in text
    assert "dvc data/tokenizer" in text and "in DVC cache" in text
    lin = trace.lineage(chain / "data/finetune/model.pt")
    results = trace_verify.verify(lin, chain)
    assert results and all(r["status"] == "ok" for r in results)
    assert {r["path"] for r in results} >= {"data/raw", "data/tokenizer/vocab.txt", "data/pretrain/best.pt"}
    links = {(r["stage"], r["upstream"], r["path"]) for r in results if r["role"] == "link"}
    assert ("examples", "tokenizer", "data/tokenizer/tokenizer.json") in links
    assert ("clean", "download", "data/raw") in links
    assert [r["path"] for r in results if r["role"] == "dvc"] == ["data/tokenizer"]


def test_tampered_file_is_changed_and_fails(chain, capsys):
    vocab = chain / "data/tokenizer/vocab.txt"
    before = hash_path(vocab)
    vocab.write_text("[PAD]\n[UNK]\n[EVIL]\n")
    lin = trace.lineage(chain / "data/finetune/model.pt")
    bad = [r for r in trace_verify.verify(lin, chain) if r["status"] != "ok"]
    assert bad == [
        {
            "stage": "tokenizer",
            "role": "output",
            "path": "data/tokenizer/vocab.txt",
            "recorded": before,
            "actual": hash_path(vocab),
            "status": "changed",
        }
    ]
    with pytest.raises(SystemExit) as e:
        trace_cli.main([str(chain / "data/finetune/model.pt"), "--verify", "--root", str(chain)])
    assert e.value.code == 1
    captured = capsys.readouterr()
    text = captured.out
    assert f"CHANGED (now {hash_path(vocab)[:12]})" in text
    assert f"recorded {before}" in text and f"now      {hash_path(vocab)}" in text  # both full hashes
    assert "CHANGED data/tokenizer/vocab.txt  (output of tokenizer)" in text
    assert "does not match" in captured.err
    # --json carries the same verdict
    with pytest.raises(SystemExit):
        trace_cli.main([str(chain / "data/finetune/model.pt"), "--verify", "--json", "--root", str(chain)])
    out = json.loads(capsys.readouterr().out)
    assert out["summary"]["changed"] == 1


def test_broken_cross_link_names_both_hashes(chain, capsys):
    """An examples record that read a different tokenizer than the tokenizer stage wrote."""
    model = chain / "data/finetune/model.pt"
    ckpt = torch.load(model, weights_only=True)
    tok = hash_path(chain / "data/tokenizer/tokenizer.json")
    ckpt["provenance"]["pretrain"]["upstream"]["examples"]["inputs"]["data/tokenizer/tokenizer.json"] = "0" * 64
    torch.save(ckpt, chain / "forged.pt")
    results = trace_verify.verify(trace.lineage(chain / "forged.pt"), chain)
    link = [r for r in results if r["role"] == "link" and r["status"] == "changed"]
    assert link == [
        {
            "stage": "examples",
            "role": "link",
            "path": "data/tokenizer/tokenizer.json",
            "recorded": "0" * 64,
            "actual": tok,
            "status": "changed",
            "upstream": "tokenizer",
        }
    ]
    with pytest.raises(SystemExit) as e:
        trace_cli.main([str(chain / "forged.pt"), "--verify", "--root", str(chain)])
    assert e.value.code == 1
    text = capsys.readouterr().out
    assert "(input of examples vs output of tokenizer)" in text
    assert f"recorded {'0' * 64}" in text and f"upstream {tok}" in text


def test_changed_params_yaml_is_reported_with_the_keys(chain, capsys):
    lin = trace.lineage(chain / "data/finetune/model.pt")
    params = {n["stage"]: n["params"] for n in lin["chain"]}
    (chain / "params.yaml").write_text(yaml.safe_dump(params))
    results = trace_verify.verify(lin, chain)
    assert sorted(r["stage"] for r in results if r["role"] == "params" and r["status"] == "ok") == sorted(STAGES)
    params["examples"]["seq"] = 64
    (chain / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(SystemExit) as e:
        trace_cli.main([str(chain / "data/finetune/model.pt"), "--verify", "--root", str(chain)])
    assert e.value.code == 1
    text = capsys.readouterr().out
    assert f"params {params_hash({'seq': 32})[:12]} (params.yaml now {params_hash({'seq': 64})[:12]})" in text
    assert "CHANGED params.yaml:examples  (params of examples)" in text and "seq: 32 -> 64" in text


def test_params_yaml_keys_the_record_leaves_out_are_not_compared(chain):
    """A data stage records its recipe keys only (workers, engine ... change no byte): extra keys in
    params.yaml leave the check ok, a recorded key that changed is still caught."""
    lin = trace.lineage(chain / "data/finetune/model.pt")
    params = {n["stage"]: dict(n["params"], workers=4, engine="dask") for n in lin["chain"]}
    (chain / "params.yaml").write_text(yaml.safe_dump(params))
    checks = [r for r in trace_verify.verify(lin, chain) if r["role"] == "params"]
    assert sorted(r["stage"] for r in checks if r["status"] == "ok") == sorted(STAGES)
    params["examples"]["seq"] = 64
    (chain / "params.yaml").write_text(yaml.safe_dump(params))
    (bad,) = [r for r in trace_verify.verify(lin, chain) if r["role"] == "params" and r["status"] != "ok"]
    assert bad["stage"] == "examples" and bad["detail"] == ["seq: 32 -> 64"]


def test_dvc_cache_object_gone_is_reported_not_failed(chain, capsys):
    shutil.rmtree(chain / ".dvc/cache/files/md5")
    assert trace_cli.main([str(chain / "data/finetune/model.pt"), "--verify", "--root", str(chain)]) == 0
    text = capsys.readouterr().out
    assert "not in DVC cache" in text and "verify: 18 ok, 0 changed, 1 not present" in text
    assert "git log --reverse --format=%h -S " in text  # how to find the dvc.lock that restores it


def test_checkpoint_alone_traces_the_whole_chain(chain, tmp_path_factory, capsys):
    """Another machine: only the checkpoint, no data/, no records, no DVC cache."""
    alone = tmp_path_factory.mktemp("elsewhere")
    shutil.copy(chain / "data/finetune/model.pt", alone / "model.pt")
    assert trace_cli.main([str(alone / "model.pt"), "--verify", "--root", str(alone)]) == 0
    text = capsys.readouterr().out
    lin = trace.lineage(alone / "model.pt")
    assert [n["stage"] for n in lin["chain"]] == STAGES
    results = trace_verify.verify(lin, alone)
    assert {r["status"] for r in results if r["role"] in ("input", "output", "dvc")} == {"missing"}
    assert all(r["status"] == "ok" for r in results if r["role"] == "link")  # the records still agree
    assert "verify: 6 ok, 0 changed, 13 not present" in text
    assert "data/tokenizer/vocab.txt" in text and "not present" in text


def test_deleted_data_is_not_present_not_failure(chain, capsys):
    shutil.rmtree(chain / "data/raw")
    lin = trace.lineage(chain / "data/finetune/model.pt")
    missing = [r for r in trace_verify.verify(lin, chain) if r["status"] == "missing"]
    assert {(r["stage"], r["role"]) for r in missing} == {("clean", "input"), ("download", "output")}
    assert all(r["path"] == "data/raw" and r["actual"] is None for r in missing)
    assert trace_cli.main([str(chain / "data/finetune/model.pt"), "--verify", "--root", str(chain)]) == 0
    text = capsys.readouterr().out
    assert "verify: 17 ok, 0 changed, 2 not present" in text  # one path, recorded by two stages
    assert re.search(r"out data/raw +[0-9a-f]{12}  not present", text)


def test_exported_directory(chain, capsys):
    """A Hugging Face export (bertrace_export.json) and a downloaded MLflow model (MLmodel)."""
    model = chain / "data/finetune/model.pt"
    ckpt = torch.load(model, weights_only=True)
    hf = chain / "exported"
    hf.mkdir()
    (hf / "bertrace_export.json").write_text(
        json.dumps(
            {
                "kind": "classifier",
                "source_checkpoint": "data/finetune/model.pt",
                "source_sha256": sha256_file(model),
                "provenance": ckpt["provenance"],
            }
        )
    )
    lin = trace.lineage(hf)
    assert lin["kind"] == "Hugging Face export of data/finetune/model.pt"
    assert [n["stage"] for n in lin["chain"]] == STAGES
    assert trace_cli.main([str(hf), "--verify", "--root", str(chain)]) == 0
    assert f"exported from: data/finetune/model.pt  {sha256_file(model)[:12]}  ok" in capsys.readouterr().out

    mlm = chain / "mlflow-model"
    (mlm / "artifacts").mkdir(parents=True)
    shutil.copy(model, mlm / "artifacts/model.pt")
    (mlm / "MLmodel").write_text(
        yaml.safe_dump(
            {
                "run_id": "r1",
                "flavors": {"python_function": {"artifacts": {"checkpoint": {"path": "artifacts/model.pt"}}}},
                "metadata": {"bertrace_checkpoint_sha256": sha256_file(model)},
            }
        )
    )
    lin = trace.lineage(mlm)
    assert lin["kind"] == "MLflow model directory (run r1)" and lin["target_sha256"] == sha256_file(model)
    assert [r["status"] for r in trace_verify.verify(lin, chain) if r["role"] == "target"] == ["ok"]

    model.write_bytes(model.read_bytes() + b"tampered")  # the export no longer matches its source
    with pytest.raises(SystemExit) as e:
        trace_cli.main([str(hf), "--verify", "--root", str(chain)])
    assert e.value.code == 1
    assert "(exported from)" in capsys.readouterr().out


def test_mlflow_run_id_and_model_uris(chain, monkeypatch, capsys):
    """A stage run logged to MLflow is traced from its run id, runs:/ and models:/ URIs."""
    from stages.common import StageRun

    monkeypatch.chdir(chain)
    with StageRun("finetune", {"epochs": 1}) as run:
        best = run.add_input("data/pretrain/best.pt")
        run.add_input("data/tokenizer/tokenizer.json")
        run.add_upstream("pretrain")
        run.add_output("data/finetune/model.pt")
        run.write_provenance()
        model_dir = chain / "mlflow-model"
        (model_dir / "artifacts").mkdir(parents=True)
        shutil.copy("data/finetune/model.pt", model_dir / "artifacts/model.pt")
        (model_dir / "MLmodel").write_text(
            yaml.safe_dump(
                {
                    "flavors": {"python_function": {"artifacts": {"checkpoint": {"path": "artifacts/model.pt"}}}},
                    "metadata": {"bertrace_checkpoint_sha256": sha256_file("data/finetune/model.pt")},
                }
            )
        )
        mlflow.log_artifacts(str(model_dir), "model")
        run_id = run.mlflow_run_id
    client = mlflow.MlflowClient()
    tags = client.get_run(run_id).data.tags
    assert tags["bertrace.provenance_artifact"] == "provenance/finetune.json"
    assert tags["bertrace.chain.pretrain_checkpoint_sha256"] == best
    assert tags["bertrace.chain.tokenizer_sha256"] == hash_path(chain / "data/tokenizer/tokenizer.json")
    assert tags["bertrace.chain.examples_sha256"] == hash_path(chain / "data/examples/manifest.json")
    assert tags["bertrace.chain.finetune_checkpoint_sha256"] == sha256_file(chain / "data/finetune/model.pt")

    lin = trace.lineage(run_id)
    assert lin["kind"] == f"MLflow run {run_id} (finetune)"
    assert [n["stage"] for n in lin["chain"]] == STAGES
    assert lin["chain"][0]["mlflow_run_id"] == run_id

    client.create_registered_model("bt")
    client.create_model_version("bt", source=f"{client.get_run(run_id).info.artifact_uri}/model", run_id=run_id)
    client.set_registered_model_alias("bt", "champion", "1")
    for uri in (f"runs:/{run_id}/model", "models:/bt/1", "models:/bt@champion"):
        lin = trace.lineage(uri)
        assert lin["kind"] == f"MLflow model of run {run_id} (finetune)", uri
        assert lin["target_sha256"] == sha256_file(chain / "data/finetune/model.pt")
        assert [r["status"] for r in trace_verify.verify(lin, chain) if r["role"] == "target"] == ["ok"]
    assert trace_cli.main([f"runs:/{run_id}/model", "--verify"]) == 0
    assert "checkpoint in the MLflow model" in capsys.readouterr().out

    with pytest.raises(BertraceError, match="not found in the MLflow store"):
        trace.lineage("0" * 32)
    with pytest.raises(BertraceError, match="not found in the MLflow store"):
        trace.lineage("models:/bt/7")


def test_corrupt_or_missing_target_is_a_clear_error(chain, capsys):
    model = chain / "data/finetune/model.pt"
    model.write_bytes(model.read_bytes()[:50])
    with pytest.raises(BertraceError, match="model.pt: not a readable checkpoint"):
        trace.lineage(model)
    with pytest.raises(BertraceError, match="nope.pt: not found; give a checkpoint"):
        trace.lineage(chain / "nope.pt")
    with pytest.raises(BertraceError, match="a directory without bertrace_export.json or MLmodel"):
        trace.lineage(chain / "data")
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


# --------------------------------------------------------------------------------------------
# Shards: every shard the examples manifest lists, rehashed against it


@pytest.fixture
def shard_chain(tmp_path):
    """``chain`` over a real examples directory: 2 train shards + 1 valid shard in the manifest."""
    from tests.support.examples_data import make_examples

    make_examples(tmp_path / "data/examples", train_rows=64, valid_rows=32, rows_per_shard=32)
    return _build_chain(tmp_path)


def _shards(root: Path) -> dict[str, str]:
    manifest = json.loads((root / "data/examples/manifest.json").read_text())
    return {f"data/examples/{e['path']}": e["sha256"] for s in manifest["splits"].values() for e in s["shards"]}


def test_verify_rehashes_every_shard_of_the_examples_manifest(shard_chain, capsys):
    assert trace_cli.main([str(shard_chain / "data/pretrain/best.pt"), "--verify", "--root", str(shard_chain)]) == 0
    text = capsys.readouterr().out
    assert "3 shards listed in data/examples/manifest.json: 3 ok" in text
    assert "shard-0000" not in text  # one summary line, no line per good shard
    results = trace_verify.verify(trace.lineage(shard_chain / "data/finetune/model.pt"), shard_chain)
    shards = [r for r in results if r["role"] == "shard"]
    assert {r["path"]: r["recorded"] for r in shards} == _shards(shard_chain)
    assert {(r["stage"], r["status"], r["manifest"]) for r in shards} == {
        ("examples", "ok", "data/examples/manifest.json")
    }


def test_rewritten_or_truncated_shard_is_changed_with_both_hashes(shard_chain, capsys):
    from tests.support.examples_data import flip_first_label, rewrite_shard, truncate

    recorded = _shards(shard_chain)
    flipped = rewrite_shard(shard_chain / "data/examples/train/shard-00001.parquet", flip_first_label)
    cut = truncate(shard_chain / "data/examples/valid/shard-00000.parquet")
    for target in ("data/pretrain/best.pt", "data/finetune/model.pt", "data/provenance/examples.json"):
        with pytest.raises(SystemExit) as e:
            trace_cli.main([str(shard_chain / target), "--verify", "--root", str(shard_chain)])
        assert e.value.code == 1
        captured = capsys.readouterr()
        text = captured.out
        assert "3 shards listed in data/examples/manifest.json: 1 ok, 2 CHANGED" in text
        for shard, now in (
            ("data/examples/train/shard-00001.parquet", sha256_file(flipped)),
            ("data/examples/valid/shard-00000.parquet", sha256_file(cut)),
        ):
            block = text[text.index(f"CHANGED {shard}  (shard listed in data/examples/manifest.json)") :]
            assert block.splitlines()[1:3] == [f"   recorded {recorded[shard]}", f"   now      {now}"]
        assert "train/shard-00000.parquet" not in text  # the intact shard: counted, not listed
        assert "does not match" in captured.err
    with pytest.raises(SystemExit):
        trace_cli.main([str(shard_chain / "data/pretrain/best.pt"), "--verify", "--json", "--root", str(shard_chain)])
    out = json.loads(capsys.readouterr().out)
    assert out["summary"]["changed"] == 2
    assert {v["path"] for v in out["verification"] if v["status"] == "changed"} == {
        "data/examples/train/shard-00001.parquet",
        "data/examples/valid/shard-00000.parquet",
    }


def test_shard_not_present_is_listed_and_a_changed_manifest_is_not_trusted(shard_chain, capsys):
    (shard_chain / "data/examples/train/shard-00000.parquet").unlink()
    assert trace_cli.main([str(shard_chain / "data/pretrain/best.pt"), "--verify", "--root", str(shard_chain)]) == 0
    text = capsys.readouterr().out
    assert "3 shards listed in data/examples/manifest.json: 2 ok, 1 not present" in text
    assert "not present data/examples/train/shard-00000.parquet  (shard listed in data/examples/manifest.json)" in text
    # a manifest rewritten to match tampered shards: the manifest is CHANGED, its shard list is not read
    from tests.support.examples_data import flip_first_label, rewrite_shard

    manifest_path = shard_chain / "data/examples/manifest.json"
    manifest = json.loads(manifest_path.read_text())
    shard = rewrite_shard(shard_chain / "data/examples/train/shard-00001.parquet", flip_first_label)
    manifest["splits"]["train"]["shards"][1]["sha256"] = sha256_file(shard)
    manifest_path.write_text(json.dumps(manifest))
    results = trace_verify.verify(trace.lineage(shard_chain / "data/pretrain/best.pt"), shard_chain)
    assert not [r for r in results if r["role"] == "shard"]
    assert ("pretrain", "input", "changed") in {
        (r["stage"], r["role"], r["status"]) for r in results if r["path"] == "data/examples/manifest.json"
    }


def _run_logged_record(root: Path, stage: str, with_log: bool) -> Path:
    """``data/provenance/<stage>.json`` as stages write it now (record_version 2: no run fields),
    with its run log in ``runs/<stage>.json`` where ``with_log``; ``root`` a DVC repository."""
    (root / "dvc.yaml").write_text("stages: {}\n")
    path = root / "data/provenance" / f"{stage}.json"
    full = json.loads(path.read_text())
    record = {**{k: v for k, v in full.items() if k not in RUN_FIELDS}, "record_version": 2}
    path.write_text(json.dumps(record))
    if with_log:
        log = {k: full[k] for k in RUN_FIELDS if k in full} | {"record_sha256": record_digest(record)}
        _write(root, f"runs/{stage}.json", json.dumps(log))
    return path


@pytest.mark.parametrize("with_log", [True, False], ids=["run-log", "no-run-log"])
def test_trace_from_another_directory_finds_the_repositorys_run_logs(
    chain, tmp_path_factory, monkeypatch, capsys, with_log
):
    """`trace` of a record run from outside the repository reads that repository's runs/ (and its
    ./mlflow.db): the commit and finish time, not "no git" and "-"; with no run log anywhere it
    says the run is unknown here, not that there was no git."""
    target = _run_logged_record(chain, "download", with_log)
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert trace.repository_root(target) == chain.resolve()
    assert trace_cli.main([str(target)]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if "└─ download" in x]
    if with_log:
        assert re.search(rf"commit {COMMIT[:7]}\w*  params \w+  finished 2026-01-01T00:00:0\d", line), line
        assert "no git" not in line and "?" not in line
    else:
        assert re.search(r"commit \?  params \w+  finished \?$", line.split("  (")[0]), line
        assert line.endswith("  (no run log of this record here: made in another copy, or restored by DVC)"), line


def test_the_repository_of_an_output_symlinked_into_a_cache_elsewhere(tmp_path, monkeypatch):
    """DVC's cache.type symlink with the cache on another filesystem: the output's own folders
    name its repository, not the cache object the link resolves to."""
    repo, cache = tmp_path / "repo", tmp_path / "cache" / "files" / "md5" / "ab"
    (repo / ".dvc").mkdir(parents=True)
    (repo / "dvc.yaml").write_text("stages: {}\n")
    cache.mkdir(parents=True)
    (cache / "cdef").write_bytes(b"weights")
    (repo / "data").mkdir()
    (repo / "data" / "model.pt").symlink_to(cache / "cdef")
    monkeypatch.chdir(tmp_path)
    assert trace.repository_root(repo / "data" / "model.pt") == repo.resolve()
    assert trace.repository_root(cache / "cdef") == Path(".")
