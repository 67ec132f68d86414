"""End-to-end: real `dvc repro` of the whole DAG (tiny params) in a temporary copy of the repo.

Asserts what users rely on: outputs exist and chain their provenance, MLflow holds one run
per stage sharing a pipeline-run id and the same chain ids, `bertrace trace --verify` checks the
pipeline's checkpoint from disk and from MLflow, a second repro runs nothing, a clean clone with
the DVC cache rebuilds nothing, and changing a param reruns exactly the stages downstream of it
(upstream outputs untouched; a run on an uncommitted params.yaml is marked dirty). That a rebuild
with the same params and seeds writes the same bytes: tests/e2e/test_stable_lock.py.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.core.io import sha256_file
from tests.conftest import REPO, shared_file
from tests.support.repos import copy_repo, run_cmd, tiny_params

pytestmark = pytest.mark.slow
MODEL_NAME = "bertrace-sst2"
CHAIN_STAGES = ["evaluate", "finetune", "pretrain", "examples", "tokenizer", "clean", "download"]


def _ran(output: str) -> set[str]:
    return set(re.findall(r"Running stage '([^']+)'", output))


def _stages(root: Path) -> list[str]:
    """dvc.yaml's stage names in order, ``foreach`` stages expanded as DVC names them
    (``finetune_variant@frozen``)."""
    from pipeline.lineage.provenance import dvc_stages

    return list(dvc_stages(root))


VARIANTS = ["finetune_variant@frozen", "finetune_variant@scratch"]  # params.yaml finetune_variants


def _lock(root: Path) -> dict[str, dict[str, str]]:
    """``{stage: {out path: md5}}`` from dvc.lock."""
    stages = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
    return {name: {o["path"]: o["md5"] for o in entry.get("outs", [])} for name, entry in stages.items()}


def _trace(root: Path, env: dict, *args: str, check: bool = True):
    return run_cmd([sys.executable, "-m", "stages.cli", "trace", *args], root, env, check=check)


def _mlflow_client(root: Path):
    import mlflow

    return mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{root}/mlflow.db")


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("repo")
    copy_repo(root)
    params = tiny_params(yaml.safe_load((root / "params.yaml").read_text()))
    params["evaluate"]["registered_model_name"] = MODEL_NAME
    params["finetune"]["pooling"] = "cls"  # the Hugging Face export below needs BERT's [CLS] pooling
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = str(root)
    env.pop("MLFLOW_TRACKING_URI", None)  # the stages' default: <repo>/mlflow.db
    # Task data (SST-2) through the offline mirror of ../shared/data; the corpus is a local file.
    shared_file("sst2", "train.tsv")
    env["BERTRACE_HUB_MIRROR"] = str(REPO / "mirrors" / "shared-data.yaml")
    env["TQDM_DISABLE"] = "1"
    run_cmd(["git", "init", "-q"], root)
    run_cmd(["git", "add", "-A"], root)
    run_cmd(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init"], root)
    first = run_cmd(["dvc", "repro"], root, env)
    return root, env, first.stdout + first.stderr


def test_first_repro_runs_every_stage_and_writes_outputs(repo):
    root, _, out = repo
    assert _ran(out) == set(_stages(root)), out
    assert set(VARIANTS) <= _ran(out)
    assert (root / "data/clean/train.txt").stat().st_size > 0
    assert (root / "data/tokenizer/vocab.txt").read_text().splitlines()[:5] == [
        "[PAD]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
    ]
    manifest = yaml.safe_load((root / "data/examples/manifest.json").read_text())
    assert manifest["splits"]["train"]["rows"] > 0 and manifest["splits"]["valid"]["rows"] > 0
    assert (root / "metrics/validate.json").exists()


def test_provenance_chains_back_to_the_source(repo):
    root, _, _ = repo
    import json

    examples = json.loads((root / "data/provenance/examples.json").read_text())
    tokenizer = json.loads((root / "data/provenance/tokenizer.json").read_text())
    clean = json.loads((root / "data/provenance/clean.json").read_text())
    # examples read exactly the bytes tokenizer and clean wrote
    assert examples["inputs"]["data/tokenizer/tokenizer.json"] == tokenizer["outputs"]["data/tokenizer/tokenizer.json"]
    assert examples["inputs"]["data/clean/train.txt"] == clean["outputs"]["data/clean/train.txt"]
    assert examples["upstream"]["tokenizer"]["upstream"]["clean"]["upstream"]["download"]["stage"] == "download"
    # a data stage records the keys dvc.yaml tracks: the worker and engine keys change no output
    lock_params = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
    for record in (examples, tokenizer, clean):
        assert not {"workers", "engine", "dask_scheduler"} & set(record["params"])
        tracked = lock_params[record["stage"]]["params"]["params.yaml"]
        assert {f"{record['stage']}.{k}" for k in record["params"]} == set(tracked)
    download = examples["upstream"]["clean"]["upstream"]["download"]
    assert (
        download["inputs"]["data/sources/wiki.raw"]
        == __import__("hashlib").sha256((root / "data/sources/wiki.raw").read_bytes()).hexdigest()
    )
    head = run_cmd(["git", "rev-parse", "HEAD"], root).stdout.strip()
    assert json.loads((root / "runs/examples.json").read_text())["git"]["commit"] == head
    assert "git" not in examples and "started" not in examples  # run fields live in the run log
    assert examples["params_hash"] and examples["params"]["dupe_factor"] == 2


def test_mlflow_has_one_run_per_stage_with_a_shared_pipeline_run_id(repo):
    root, _, _ = repo
    import mlflow

    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{root}/mlflow.db")
    exp = client.get_experiment_by_name("bertrace")
    runs = client.search_runs([exp.experiment_id], max_results=100)
    # one parent run for the `dvc repro` (pipeline.lineage.tracking), the stage runs nested, the seeds under finetune's
    (parent,) = [r for r in runs if r.data.tags.get("bertrace.run_kind") == "pipeline"]
    stage_runs = [r for r in runs if r.data.tags.get("bertrace.run_kind") == "stage"]
    seed_runs = [r for r in runs if "bertrace.seed" in r.data.tags]
    assert len(runs) == 1 + len(stage_runs) + len(seed_runs)
    assert {r.data.tags["mlflow.parentRunId"] for r in stage_runs} == {parent.info.run_id}
    assert {r.data.tags["bertrace.stage"] for r in seed_runs} == {"finetune", *VARIANTS}
    by_stage = {r.data.tags["bertrace.stage"]: r for r in stage_runs}
    # every stage that makes data logs a run; `scorecard` and `plots` only redraw reports from committed rows
    stages = [s for s in _stages(root) if s not in ("scorecard", "plots")]
    assert set(by_stage) == set(stages)
    assert len(stage_runs) == len(stages)  # one run per stage
    ids = {r.data.tags["bertrace.pipeline_run_id"] for r in stage_runs}
    assert len(ids) == 1, ids
    tok_sha = by_stage["tokenizer"].data.tags["bertrace.tokenizer_sha256"]
    assert by_stage["examples"].data.tags["bertrace.input.tokenizer.json"] == tok_sha
    assert by_stage["examples"].data.metrics["train.rows"] > 0


def test_records_name_the_upstream_dvc_lock_entries(repo):
    """Each record holds the dvc.lock md5s of the outputs it read, as DVC had just written them."""
    root, _, _ = repo
    lock = _lock(root)
    record = lambda stage: json.loads((root / f"data/provenance/{stage}.json").read_text())  # noqa: E731
    assert record("clean")["dvc_lock"]["download"]["outs"]["data/raw"] == lock["download"]["data/raw"]
    assert record("examples")["dvc_lock"]["tokenizer"]["outs"]["data/tokenizer"] == lock["tokenizer"]["data/tokenizer"]
    pretrain = record("pretrain")["dvc_lock"]
    assert set(pretrain) == {"examples", "validate"}
    assert pretrain["examples"]["outs"]["data/examples"] == lock["examples"]["data/examples"]
    finetune = record("finetune")["dvc_lock"]
    assert finetune["pretrain"]["outs"]["data/pretrain"] == lock["pretrain"]["data/pretrain"]
    assert record("download")["dvc_lock"] == {}


def test_every_run_carries_the_chain_ids(repo):
    """Filter MLflow runs by tokenizer / examples / checkpoint hash: every downstream run matches."""
    root, _, _ = repo
    client = _mlflow_client(root)
    exp = client.get_experiment_by_name("bertrace").experiment_id
    tok = json.loads((root / "data/provenance/tokenizer.json").read_text())["outputs"]["data/tokenizer/tokenizer.json"]
    best = json.loads((root / "data/provenance/pretrain.json").read_text())["outputs"]["data/pretrain/best.pt"]
    examples = json.loads((root / "data/provenance/examples.json").read_text())["outputs"][
        "data/examples/manifest.json"
    ]

    def stages(filter_string):
        runs = client.search_runs([exp], filter_string=filter_string, max_results=100)
        return sorted(r.data.tags["bertrace.stage"] + ("/seed" if "bertrace.seed" in r.data.tags else "") for r in runs)

    variants = sorted(VARIANTS + [f"{v}/seed" for v in VARIANTS])
    downstream = ["evaluate", "examples", "finetune", "finetune/seed", *variants, "pretrain", "tokenizer", "validate"]
    assert stages(f"tags.`bertrace.chain.tokenizer_sha256` = '{tok}'") == downstream
    assert stages(f"tags.`bertrace.chain.examples_sha256` = '{examples}'") == [
        "evaluate",
        "examples",
        "finetune",
        "finetune/seed",
        *variants,
        "pretrain",
        "validate",
    ]
    assert stages(f"tags.`bertrace.chain.pretrain_checkpoint_sha256` = '{best}'") == [
        "evaluate",
        "finetune",
        "finetune/seed",
        *variants,
        "pretrain",
    ]
    assert stages("tags.`bertrace.git_dirty` = 'True'") == []  # committed tree: clean


def test_trace_verifies_the_pipeline_checkpoint_from_disk_mlflow_and_export(repo, tmp_path):
    root, env, _ = repo
    head = run_cmd(["git", "rev-parse", "HEAD"], root).stdout.strip()
    out = _trace(root, env, "data/finetune/model.pt", "--verify").stdout
    assert "verify: " in out and "0 changed, 0 not present" in out, out
    for stage in CHAIN_STAGES[1:]:
        assert f"└─ {stage}  commit {head[:12]}  params" in out, (stage, out)
    assert "in DVC cache" in out and "(dirty)" not in out
    lin = json.loads(_trace(root, env, "data/finetune/model.pt", "--json").stdout)
    assert [n["stage"] for n in lin["chain"]] == CHAIN_STAGES[1:]
    assert lin["chain"][-1]["source"] == "local data/sources/wiki.raw"
    # pre-training ran on the portable kernels (params.yaml compute), which any x86-64 CPU with AVX2 rebuilds
    out = _trace(root, env, "data/pretrain/best.pt").stdout
    if platform.machine().lower() in ("x86_64", "amd64"):
        assert re.search(r"fp32, torch \S+, \d CPU threads?, portable kernels \(AVX2\)", out), out
        assert "CPU threads and portable kernels: the same bytes" in out, out

    # MLflow: the evaluate run, its pyfunc model and the registered version
    client = _mlflow_client(root)
    exp = client.get_experiment_by_name("bertrace").experiment_id
    (evaluate,) = client.search_runs([exp], filter_string="tags.`bertrace.stage` = 'evaluate'")
    run_id = evaluate.info.run_id
    out = _trace(root, env, run_id, "--verify").stdout
    assert f"(MLflow run {run_id} (evaluate)" in out and "0 changed, 0 not present" in out
    for uri in (f"runs:/{run_id}/model", f"models:/{MODEL_NAME}/1"):
        out = _trace(root, env, uri, "--verify").stdout
        assert re.search(r"checkpoint in the MLflow model: \S+  [0-9a-f]{12}  ok", out), out
        assert "0 changed, 0 not present" in out

    # a Hugging Face export made outside the repo
    run_cmd(
        [
            sys.executable,
            "-m",
            "stages.cli",
            "export",
            "--hf",
            str(tmp_path / "hf"),
            "--checkpoint",
            "data/finetune/model.pt",
        ],
        root,
        env,
    )
    out = _trace(root, env, str(tmp_path / "hf"), "--verify").stdout
    assert "exported from: data/finetune/model.pt" in out and "0 changed" in out

    # the checkpoint alone, on a machine without data/: the chain is complete, files not present
    shutil.copy(root / "data/finetune/model.pt", tmp_path / "model.pt")
    proc = _trace(root, env, str(tmp_path / "model.pt"), "--verify", "--root", str(tmp_path))
    assert [
        n["stage"] for n in json.loads(_trace(root, env, str(tmp_path / "model.pt"), "--json").stdout)["chain"]
    ] == CHAIN_STAGES[1:]
    assert "0 changed" in proc.stdout and "not present" in proc.stdout


def _keys(where: Path, password: bytes | None = None) -> tuple[Path, Path]:
    """A real EC P-256 key pair in PEM (the private one encrypted with ``password``)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    enc = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    where.mkdir(parents=True, exist_ok=True)
    (where / "priv.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc)
    )
    (where / "pub.pem").write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return where / "priv.pem", where / "pub.pem"


def test_attestation_verifies_and_names_what_was_tampered(repo, tmp_path):
    """`bertrace attest` signs an in-toto/SLSA statement of the fine-tuned checkpoint with a key
    made here; `verify-attestation` passes, then fails with one line naming the tampered model,
    the tampered material, the other key, the edited statement and the missing signature (on a
    copy of the repository: its outputs are hard links into the DVC cache, never edited in place)."""
    root, env, _ = repo
    copy = tmp_path / "copy"
    shutil.copytree(root, copy, symlinks=True, ignore=shutil.ignore_patterns(".dvc"))
    priv, pub = _keys(tmp_path / "team", b"s3cret-pass")
    _, other = _keys(tmp_path / "other")
    env = {**env, "PYTHONPATH": str(copy), "BERTRACE_SIGNING_KEY_PASSWORD": "s3cret-pass"}

    def cli(*args):
        return run_cmd([sys.executable, "-m", "stages.cli", *args], copy, env, check=False)

    done = cli("attest", "data/finetune/model.pt", "--key", str(priv))
    assert done.returncode == 0, done.stderr
    statement_file = copy / "attestations/data/finetune/model.pt.intoto.json"
    statement = json.loads(statement_file.read_text())
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    subjects = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
    assert subjects == {
        "data/finetune/model.pt": sha256_file(copy / "data/finetune/model.pt"),
        "data/pretrain/best.pt": sha256_file(copy / "data/pretrain/best.pt"),
    }
    deps = statement["predicate"]["buildDefinition"]["resolvedDependencies"]
    names = {d["name"] for d in deps}
    assert {"data/raw", "data/clean/train.txt", "data/tokenizer/tokenizer.json", "data/examples/manifest.json"} <= names
    assert {
        f"bertrace:code/{s}" for s in ("download", "clean", "tokenizer", "examples", "pretrain", "finetune")
    } <= names
    stages = statement["predicate"]["buildDefinition"]["externalParameters"]["stages"]
    assert stages["pretrain"]["params_hash"] and set(stages) >= {"download", "clean", "finetune"}
    secret = priv.read_text().splitlines()[1:-1]  # the key's base64 lines
    for written in (statement_file, statement_file.with_name(statement_file.name + ".sig")):
        text = written.read_text()
        assert "s3cret-pass" not in text and not any(line in text for line in secret), written

    def verify(key=pub):
        proc = cli("verify-attestation", "data/finetune/model.pt", "--key", str(key))
        return proc.returncode, [line for line in proc.stdout.splitlines() if line.startswith("FAILED")]

    ok = cli("verify-attestation", "data/finetune/model.pt", "--key", str(pub))
    assert ok.returncode == 0 and "verified" in ok.stdout, ok.stdout + ok.stderr
    code, lines = verify(other)
    assert code == 1 and len(lines) == 1 and "another key" in lines[0]

    def replaced(path: Path, data: bytes) -> bytes:  # a new file, not an in-place edit
        old = path.read_bytes()
        path.unlink()
        path.write_bytes(data)
        return old

    old = replaced(copy / "data/clean/valid.txt", b"a tampered corpus line\n")
    code, lines = verify()
    assert code == 1 and len(lines) == 1 and "data/clean/valid.txt" in lines[0], lines
    replaced(copy / "data/clean/valid.txt", old)
    old = replaced(copy / "data/finetune/model.pt", (copy / "data/finetune/model.pt").read_bytes() + b"\0")
    code, lines = verify()
    assert code == 1 and len(lines) == 1 and "subject data/finetune/model.pt" in lines[0], lines
    replaced(copy / "data/finetune/model.pt", old)
    assert verify() == (0, [])
    # a rerun with other code and the same outputs rewrites the stage's own record: a note, not a failure
    record = json.loads((copy / "data/provenance/tokenizer.json").read_text())
    record["code"] = {**record["code"], "pipeline/data/tokenizer_training.py": "0" * 64}
    old = replaced(copy / "data/provenance/tokenizer.json", json.dumps(record).encode())
    proc = cli("verify-attestation", "data/finetune/model.pt", "--key", str(pub))
    assert proc.returncode == 0 and "note: material bertrace:code/tokenizer (tokenizer)" in proc.stdout, proc.stdout
    replaced(copy / "data/provenance/tokenizer.json", old)
    text = statement_file.read_text()
    statement_file.write_text(text.replace('"data/raw"', '"data/raw2"', 1))
    code, lines = verify()
    assert code == 1 and len(lines) == 1 and "changed after it was signed" in lines[0], lines
    statement_file.write_text(text)
    statement_file.with_name(statement_file.name + ".sig").unlink()
    code, lines = verify()
    assert code == 1 and len(lines) == 1 and "unsigned" in lines[0], lines

    # a Hugging Face export: its files are the subjects, its model card names the attestation
    hf = tmp_path / "hf"
    assert cli("export", "--hf", str(hf), "--checkpoint", "data/finetune/model.pt").returncode == 0
    card = (hf / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers\npipeline_tag: text-classification")
    ckpt_seed = re.search(r"this checkpoint's seed: (\d+)", card)
    assert ckpt_seed and "| validation_accuracy |" in card and "Attestation: none yet" in card
    assert "demonstration-size model" in card  # the tiny DAG's model
    assert cli("attest", str(hf), "--key", str(priv), "--root", str(copy)).returncode == 0
    statement = json.loads((hf / "attestation.intoto.json").read_text())
    assert {s["name"] for s in statement["subject"]} >= {"config.json", "model.safetensors", "bertrace_export.json"}
    assert "README.md" not in {s["name"] for s in statement["subject"]}
    assert sha256_file(hf / "attestation.intoto.json") in (hf / "README.md").read_text()
    ok = cli("verify-attestation", str(hf), "--key", str(pub), "--root", str(copy))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    (hf / "config.json").write_text((hf / "config.json").read_text().replace("{", '{"x": 1, ', 1))
    bad = cli("verify-attestation", str(hf), "--key", str(pub), "--root", str(copy))
    assert bad.returncode == 1 and "subject config.json" in bad.stdout, bad.stdout


def test_second_repro_runs_nothing(repo):
    root, env, _ = repo
    out = run_cmd(["dvc", "repro"], root, env)
    assert _ran(out.stdout + out.stderr) == set()


@pytest.fixture(scope="module")
def clone(repo, tmp_path_factory):
    """The pipeline run committed, then `git clone`d elsewhere, sharing the DVC cache."""
    root, env, _ = repo
    run_cmd(["git", "add", "-A"], root)
    run_cmd(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "pipeline run"], root)
    dest = tmp_path_factory.mktemp("clone") / "repo"
    run_cmd(["git", "clone", "-q", str(root), str(dest)], root)
    env = {**env, "PYTHONPATH": str(dest)}
    run_cmd(["dvc", "cache", "dir", "--local", str(root / ".dvc" / "cache")], dest, env)
    return dest, env


def test_clean_clone_with_the_dvc_cache_rebuilds_nothing_and_verifies(repo, clone):
    root, _, _ = repo
    dest, env = clone
    run_cmd(["dvc", "checkout"], dest, env)
    out = run_cmd(["dvc", "repro"], dest, env)
    assert _ran(out.stdout + out.stderr) == set(), out.stdout
    assert (dest / "data/finetune/model.pt").read_bytes() == (root / "data/finetune/model.pt").read_bytes()
    out = _trace(dest, env, "data/finetune/model.pt", "--verify").stdout
    assert "0 changed, 0 not present" in out, out

    # a tampered vocabulary is reported with both hashes; `dvc checkout` gives the exact bytes back
    vocab = dest / "data/tokenizer/vocab.txt"
    recorded = __import__("hashlib").sha256(vocab.read_bytes()).hexdigest()
    text = vocab.read_text()
    vocab.unlink()  # never write through a link into the DVC cache
    vocab.write_text(text.replace("[MASK]", "[MASQ]"))
    proc = _trace(dest, env, "data/finetune/model.pt", "--verify", check=False)
    assert proc.returncode == 1
    assert f"recorded {recorded}" in proc.stdout and "CHANGED data/tokenizer/vocab.txt" in proc.stdout
    run_cmd(["dvc", "checkout", "--force", "data/tokenizer"], dest, env)
    assert _trace(dest, env, "data/finetune/model.pt", "--verify").returncode == 0


def _set_param(root: Path, section: str, key: str, value) -> None:
    params = yaml.safe_load((root / "params.yaml").read_text())
    params[section][key] = value
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def _stages_from(root: Path, first: str) -> set[str]:
    """``first`` and every stage after it in dvc.yaml order (the DAG is a chain)."""
    order = _stages(root)
    return set(order[order.index(first) :])


def _unchanged_upstream(before: dict, after: dict, first: str, root: Path) -> None:
    order = _stages(root)
    for stage in order[: order.index(first)]:
        assert after[stage] == before[stage], stage


def test_examples_param_reruns_examples_and_downstream_only(repo):
    """... on a dirty tree (params.yaml not committed): records, trace and MLflow say so."""
    root, env, _ = repo
    before = _lock(root)
    _set_param(root, "examples", "dupe_factor", 3)
    out = run_cmd(["dvc", "repro"], root, env)
    assert _ran(out.stdout + out.stderr) == _stages_from(root, "examples")
    _unchanged_upstream(before, _lock(root), "examples", root)
    assert _lock(root)["examples"]["data/examples"] != before["examples"]["data/examples"]

    runs = {s: json.loads((root / f"runs/{s}.json").read_text()) for s in ("examples", "tokenizer")}
    assert runs["examples"]["git"]["dirty"] is True and runs["examples"]["git"]["dirty_paths"] == ["params.yaml"]
    assert runs["tokenizer"]["git"]["dirty"] is False  # not rerun
    out = _trace(root, env, "data/finetune/model.pt").stdout
    assert re.search(r"└─ examples  commit [0-9a-f]{12} \(dirty\)", out)
    assert re.search(r"└─ tokenizer  commit [0-9a-f]{12}  params", out)
    assert "uncommitted: params.yaml" in out and "the tree was dirty" in out
    client = _mlflow_client(root)
    exp = client.get_experiment_by_name("bertrace").experiment_id
    dirty = client.search_runs([exp], filter_string="tags.`bertrace.git_dirty` = 'True'", max_results=100)
    assert {r.data.tags["bertrace.stage"] for r in dirty} == _stages_from(root, "examples") - {"scorecard", "plots"}
    assert all(r.data.tags["bertrace.git_dirty_paths"] == "params.yaml" for r in dirty)


def test_finetune_param_reruns_finetune_and_evaluate_only(repo):
    root, env, _ = repo
    before = _lock(root)
    lr = float(yaml.safe_load((root / "params.yaml").read_text())["finetune"]["lr"])
    _set_param(root, "finetune", "lr", lr / 2)  # a value the repo does not already hold
    out = run_cmd(["dvc", "repro"], root, env)
    # plots (reports/plots.html) reruns too when the new model's confusion matrix differs
    # the variants lay their keys over finetune's: they rerun too
    assert _ran(out.stdout + out.stderr) - {"plots"} == {"finetune", *VARIANTS, "evaluate", "scorecard"}
    _unchanged_upstream(before, _lock(root), "finetune", root)


def test_a_variant_reruns_alone_and_the_scorecard_tabulates_it(repo):
    """finetune_variant@frozen's own key reruns it (and the scorecard), not finetune or the other
    variant; its results are the scorecard's "Fine-tuning variants" rows."""
    root, env, _ = repo
    before = _lock(root)
    params = yaml.safe_load((root / "params.yaml").read_text())
    assert params["finetune_variants"]["frozen"]["mode"] == "frozen"
    params["finetune_variants"]["frozen"]["lr"] = 2e-3
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    out = run_cmd(["dvc", "repro"], root, env)
    assert _ran(out.stdout + out.stderr) == {"finetune_variant@frozen", "scorecard"}
    after = _lock(root)
    assert after["finetune_variant@scratch"] == before["finetune_variant@scratch"]
    assert after["finetune"] == before["finetune"]
    frozen = json.loads((root / "reports/variants/frozen.json").read_text())
    assert frozen["mode"] == "frozen" and frozen["overrides"] == {"mode": "frozen", "lr": 2e-3}
    model = __import__("torch").load(root / "data/variants/frozen/model.pt", weights_only=False)
    assert model["mode"] == "frozen"
    card = (root / "reports/scorecard.md").read_text()
    assert "## Fine-tuning variants" in card
    acc = 100 * frozen["validation_accuracy"]["mean"]
    row = next(line for line in card.splitlines() if line.startswith("| this run | frozen |"))
    assert f"| {acc:.2f} ± " in row and "lr: 0.002" in row, row
    assert "| this run | scratch |" in card
    record = json.loads((root / "data/provenance/finetune_variant@frozen.json").read_text())
    assert record["stage"] == "finetune_variant@frozen" and record["params"]["lr"] == 2e-3
    assert record["dvc_lock"]["pretrain"]["outs"]["data/pretrain"] == after["pretrain"]["data/pretrain"]
    out = _trace(root, env, "data/variants/frozen/model.pt", "--verify").stdout  # its own record first
    assert out.splitlines()[1].startswith("└─ finetune_variant@frozen  commit"), out
    assert "└─ pretrain  commit" in out and "0 changed" in out, out


def test_a_tokenizer_param_makes_the_tokenizer_stage_stale(repo):
    """A tokenizer key is wired to the tokenizer stage: `dvc repro --dry` names it alone (its own
    params changed; what follows reruns when its outputs change, as the examples param test shows
    by running)."""
    root, env, _ = repo
    text = (root / "params.yaml").read_text()
    try:
        _set_param(root, "tokenizer", "vocab_size", 1500)
        out = run_cmd(["dvc", "repro", "--dry"], root, env)
        assert _ran(out.stdout + out.stderr) == {"tokenizer"}, out.stdout
    finally:
        (root / "params.yaml").write_text(text)


@pytest.mark.parametrize(
    "path, expected",
    [
        # the pre-training loop: pre-training (and so what follows it), nothing upstream
        ("pipeline/pretrain/loop.py", {"pretrain"}),
        # export is used by `bertrace export` only: no stage; the Hugging Face name maps also convert a
        # published checkpoint (finetune.checkpoint, pretrain.init: pipeline/interop/hf_import.py)
        ("pipeline/interop/hf.py", {"pretrain", "finetune", *VARIANTS}),
        ("pipeline/interop/export.py", set()),
        # masking: the examples stage (static masks) and pre-training (dynamic masks) both import it
        ("pipeline/data/masking.py", {"examples", "pretrain"}),
        # device resolution: the stages that run a model, not the data stages
        ("pipeline/core/device.py", {"pretrain", "finetune", *VARIANTS, "evaluate"}),
        # a reference number is not a param: only the scorecard is redrawn
        ("reports/references.yaml", {"scorecard"}),
    ],
)
def test_a_code_edit_reruns_exactly_the_stages_that_import_it(repo, path, expected):
    """`dvc repro --dry` after a harmless edit (a trailing comment) names the stages whose own deps
    changed (their downstream stages follow when their outputs change, as the param tests show)."""
    root, env, _ = repo  # up to date: a stale stage would show in the set below
    target = root / path
    original = target.read_bytes()
    try:
        target.write_bytes(original + b"\n# edited\n")
        out = run_cmd(["dvc", "repro", "--dry"], root, env)
        assert _ran(out.stdout + out.stderr) == expected, out.stdout
    finally:
        target.write_bytes(original)
