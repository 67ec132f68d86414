"""Signed provenance of a trained model that anyone with its files and a public key can check.

An in-toto Statement v1 (https://in-toto.io/Statement/v1) with a SLSA Provenance v1 predicate
(https://slsa.dev/provenance/v1): its ``subject`` is the model files with their sha256 (a
fine-tuned checkpoint and the pre-trained weights it started from, or every file of a Hugging Face
export); its ``resolvedDependencies`` are the chain ``bertrace trace`` walks (each stage's recorded
inputs and outputs: raw corpus parts, clean text, tokenizer, examples manifest, checkpoints; and
each stage's code, the sha256 of its code-deps listing); ``externalParameters`` hold every stage's
params and params hash, ``internalParameters`` the pre-training compute and arithmetic record.

Signing: sigstore's ``model-signing`` signs the statement file (a sigstore bundle beside it,
``<statement>.sig``; a team's EC key pair offline, or keyless sigstore in CI), and the statement
binds the model files by digest: signature → statement → subjects, the in-toto layering. Nothing
secret enters the statement (no key, token or host path; tested).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pipeline.core.errors import BertraceError
from pipeline.core.io import atomic_open, canonical_json, sha256_bytes, sha256_file
from pipeline.lineage.provenance import PROVENANCE_DIR
from pipeline.lineage.trace import lineage

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
SLSA_PROVENANCE = "https://slsa.dev/provenance/v1"
# What this statement's buildDefinition means (docs/provenance.md "Attestations").
BUILD_TYPE = "https://bertrace.dev/attestation/dvc-pipeline/v1"
BUILDER_ID = "https://bertrace.dev/builder/dvc-repro"
SUFFIX = ".intoto.json"  # the statement; its signature is <statement>.sig
EXPORT_STATEMENT = "attestation" + SUFFIX  # inside an export directory
_NOT_SUBJECTS = ("README.md", EXPORT_STATEMENT, EXPORT_STATEMENT + ".sig")  # the model card names the attestation


def statement_path(target: str | os.PathLike, root: str | os.PathLike) -> Path:
    """Where the statement of ``target`` lives: inside an export directory, else under
    ``root/attestations/`` at the target's path (a DVC output directory such as data/finetune/ must
    not gain files: DVC would see it changed)."""
    target, root = Path(target), Path(root)
    if target.is_dir():
        return target / EXPORT_STATEMENT
    return root / "attestations" / (_name(target, root) + SUFFIX)


def signature_path(statement_file: Path) -> Path:
    """The sigstore bundle beside a statement: ``<statement>.sig``."""
    return Path(str(statement_file) + ".sig")


def _name(path: Path, root: Path) -> str:
    """A subject's or material's name: its path relative to ``root`` (POSIX), else its file name."""
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return path.name


def subjects(target: str | os.PathLike, lin: dict[str, Any], root: str | os.PathLike) -> list[dict[str, Any]]:
    """The model files with their sha256: an export directory's files, named relative to it (its
    model card and attestation aside); or the checkpoint and, for a fine-tuned one, the pre-trained
    weights it read when present under ``root``, named relative to ``root``."""
    target, root = Path(target), Path(root)
    if target.is_dir():
        files = sorted(p for p in target.rglob("*") if p.is_file())
        names = [p.relative_to(target).as_posix() for p in files]
        return [
            {"name": n, "digest": {"sha256": sha256_file(p)}} for n, p in zip(names, files) if n not in _NOT_SUBJECTS
        ]
    files = [target]
    for node in lin["chain"]:
        if str(node["stage"]).startswith("finetune"):
            files += [root / p for p in node["inputs"] if p.endswith(".pt") and (root / p).is_file()]
    return [{"name": _name(p, root), "digest": {"sha256": sha256_file(p)}} for p in files]


def _stage_code(node: dict[str, Any], root: Path) -> str | None:
    """sha256 of the code-deps listing (``{path: sha256}``) in ``root/data/provenance/<stage>.json``
    when that record is of the same work as the chain's node (same inputs, the node's outputs among
    its outputs): the code that makes those outputs from those inputs now. Records
    embedded upstream carry no code (an upstream edit that changes no output changes no downstream
    record), so this is where it is; None when no such record is there."""
    own = root / PROVENANCE_DIR / f"{node['stage']}.json"
    try:
        record = json.loads(own.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("code"), dict):
        return None
    outputs = record.get("outputs") or {}
    same_outputs = all(outputs.get(p) == sha for p, sha in (node.get("outputs") or {}).items())
    if (record.get("inputs") or {}) != node.get("inputs") or not same_outputs:
        return None
    if not node.get("outputs") and record.get("params_hash") != node.get("params_hash"):
        return None  # a checkpoint's own stage records no outputs of itself: the params must match too
    return sha256_bytes(canonical_json(record["code"]).encode())


def materials(lin: dict[str, Any], root: str | os.PathLike) -> list[dict[str, Any]]:
    """The chain as SLSA ResourceDescriptors, oldest stage first: every recorded input and output
    (``annotations``: stage, role) and each stage's code (``bertrace:code/<stage>``, when its own
    record under ``root`` is of the same work)."""
    root = Path(root)
    out = []
    for node in reversed(lin["chain"]):
        stage = str(node["stage"])
        for role in ("inputs", "outputs"):
            for path, sha in sorted((node.get(role) or {}).items()):
                out.append(
                    {"name": path, "digest": {"sha256": sha}, "annotations": {"stage": stage, "role": role[:-1]}}
                )
        code = _stage_code(node, root)
        if code:
            out.append({"name": f"bertrace:code/{stage}", "digest": {"sha256": code}, "annotations": {"stage": stage}})
    return out


def build_statement(target: str | os.PathLike, root: str | os.PathLike = ".") -> dict[str, Any]:
    """The in-toto Statement (SLSA Provenance v1) of ``target``: a checkpoint or export directory."""
    root = Path(root)
    lin = _chain(target, root)
    nodes = lin["chain"]
    pretrain = next((n for n in nodes if n["stage"] == "pretrain"), None)
    first = nodes[0]
    return {
        "_type": STATEMENT_TYPE,
        "subject": subjects(target, lin, root),
        "predicateType": SLSA_PROVENANCE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "stages": {
                        str(n["stage"]): {"params_hash": n["params_hash"], "params": n["params"]}
                        for n in reversed(nodes)
                    }
                },
                "internalParameters": {"pretrain_compute": pretrain["compute"] if pretrain else None},
                "resolvedDependencies": materials(lin, root),
            },
            "runDetails": {
                "builder": {"id": BUILDER_ID},
                "metadata": {
                    "invocationId": first.get("pipeline_run_id") or first["record_sha256"],
                    **({"startedOn": first["started"]} if first.get("started") else {}),
                    **({"finishedOn": first["finished"]} if first.get("finished") else {}),
                },
            },
        },
    }


def _chain(target: str | os.PathLike, root: Path) -> dict[str, Any]:
    """:func:`lineage` of ``target``, which must have a chain to attest."""
    lin = lineage(target, root)
    if not lin["chain"]:
        raise BertraceError(f"{target}: no provenance chain to attest; give a checkpoint written by the pipeline")
    return lin


def write_statement(statement: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path) as f:
        f.write(json.dumps(statement, indent=2, sort_keys=True) + "\n")
    return path


def sign(statement_file: Path, private_key: Path, password: str | None = None) -> Path:
    """Sign ``statement_file`` with ``model-signing`` and an EC private key (PEM); the sigstore
    bundle goes to ``<statement_file>.sig``."""
    signing = _model_signing("signing")
    sig = signature_path(statement_file)
    if not Path(private_key).is_file():
        raise BertraceError(f"{private_key}: no such private key; give the team's signing key (PEM, EC P-256/P-384)")
    try:
        signer = signing.Config().use_elliptic_key_signer(
            private_key=private_key,
            password=password.encode() if password else None,  # read by cryptography: bytes
        )
        signer.sign(statement_file, sig)
    except (ValueError, TypeError) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise BertraceError(
            f"{private_key}: cannot sign with it ({why}); give an EC private key in PEM (its password, if any, "
            "in BERTRACE_SIGNING_KEY_PASSWORD)"
        ) from None
    return sig


def check_signature(statement_file: Path, public_key: Path) -> str | None:
    """None when ``<statement_file>.sig`` is a valid model-signing signature of the statement by
    ``public_key``; else one line saying what failed."""
    sig = signature_path(statement_file)
    if not public_key.is_file():
        raise BertraceError(f"{public_key}: no such public key; give the PEM public key of the key that signed")
    if not statement_file.is_file():
        return f"{statement_file}: no attestation; the model is not attested (run `bertrace attest`)"
    if not sig.is_file():
        return f"{sig}: no signature; the attestation is unsigned (run `bertrace attest --key KEY`)"
    verifying = _model_signing("verifying")
    try:
        verifying.Config().use_elliptic_key_verifier(public_key=public_key).verify(statement_file, sig)
    except ValueError as e:
        text = str(e)
        if "Key mismatch" in text or "key" in text.lower() and "hash" not in text.lower():
            return f"{sig}: signed by another key than {public_key}"
        if "Signature mismatch" in text or "mismatch" in text.lower():
            return f"{statement_file}: changed after it was signed (its sha256 is not the signed one)"
        return f"{sig}: the signature does not verify ({text.splitlines()[0][:200]})"
    except Exception as e:  # noqa: BLE001 - a corrupt bundle raises many types
        return f"{sig}: not a readable signature ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})"
    return None


def verify(target: str | os.PathLike, public_key: Path, root: str | os.PathLike = ".") -> tuple[list[str], list[str]]:
    """``(failures, notes)``, one line each (no failures: verified): the signature, each subject's
    sha256 against the file on disk, and the materials against what the chain re-derives now
    (``trace --verify``: each recorded file rehashed under ``root``; the statement's dependencies
    rebuilt, both ways). A stage's code that changed since without changing its outputs (its own
    record rewritten by a rerun) is a note, not a failure: the outputs are what the hashes bind."""
    from pipeline.lineage import trace_verify

    target, root = Path(target), Path(root)
    if not target.exists():
        raise BertraceError(f"{target}: not found; give the attested checkpoint or export directory")
    statement_file = statement_path(target, root)
    bad = check_signature(statement_file, Path(public_key))
    if bad:
        return [bad], []
    statement = json.loads(statement_file.read_text(encoding="utf-8"))
    failures, notes = [], []
    for subject in statement.get("subject") or []:
        path = _subject_path(subject["name"], target, root)
        if not path.is_file():
            failures.append(f"subject {subject['name']}: not present under {root}")
        elif sha256_file(path) != subject["digest"]["sha256"]:
            failures.append(f"subject {subject['name']}: sha256 differs from the attested one (the model changed)")
    lin = _chain(target, root)  # once: the materials rebuilt and the files rehashed read the same chain
    key = lambda m: json.dumps(m, sort_keys=True)  # noqa: E731
    attested = {key(m): m for m in statement["predicate"]["buildDefinition"]["resolvedDependencies"]}
    now = {key(m): m for m in materials(lin, root)}
    for k in sorted(attested.keys() ^ now.keys()):
        m = attested.get(k) or now[k]
        what = f"material {m['name']} ({m.get('annotations', {}).get('stage')})"
        how = "attested, not in the chain now" if k in attested else "in the chain now, not attested"
        (notes if m["name"].startswith("bertrace:code/") else failures).append(f"{what}: {how}")
    changed: dict[str, list[str]] = {}  # path -> the stages and roles that recorded it
    for check in trace_verify.verify(lin, root):
        if check["status"] == trace_verify.CHANGED and check["role"] in ("input", "output", "shard", "target"):
            changed.setdefault(check["path"], []).append(f"{check['stage']} {check['role']}")
    for path, where in changed.items():
        failures.append(f"material {path} ({', '.join(where)}): sha256 on disk differs from the record")
    return failures, notes


def _subject_path(name: str, target: Path, root: Path) -> Path:
    """A subject's file: export files are named relative to their directory, checkpoints to ``root``."""
    return target / name if target.is_dir() else root / name


def _model_signing(module: str):
    """``model_signing.<module>`` (``signing`` or ``verifying``), or a one-line error without it."""
    import importlib

    try:
        return importlib.import_module(f"model_signing.{module}")
    except ImportError as e:
        raise BertraceError(f"attestations need model-signing ({e}); pip install -e . (it is a dependency)") from None
