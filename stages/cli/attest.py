"""``bertrace attest`` and ``bertrace verify-attestation``: signed provenance of a model.

bertrace attest TARGET --key PRIVATE.pem [--root DIR]
    Write the in-toto Statement (SLSA Provenance v1) of TARGET (a checkpoint such as
    data/finetune/model.pt, or a `bertrace export --hf` directory) and sign it with model-signing:
    ROOT/attestations/<TARGET>.intoto.json (inside an export directory: attestation.intoto.json)
    and <statement>.sig, a sigstore bundle. The key's password, if any: BERTRACE_SIGNING_KEY_PASSWORD.

bertrace verify-attestation TARGET --key PUBLIC.pem [--root DIR]
    Check the signature, every subject's sha256 against the file on disk, and the materials
    against what `trace --verify` re-derives. Prints "verified" or one line per failure.

Exit status: 0 verified / written; 1 a failed check (tampered model or material, another key,
no signature); 2 bad input (no such target or key).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from pipeline.lineage import attestation, trace


def _parser(prog: str, key_help: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("target", help="checkpoint (data/finetune/model.pt) or exported directory")
    parser.add_argument("--key", required=True, type=Path, help=key_help)
    parser.add_argument("--root", help="the repository the recorded paths are relative to (default: TARGET's)")
    return parser


def main_attest(argv: list[str] | None = None) -> int:
    args = _parser("bertrace attest", "the team's EC private key (PEM)").parse_args(argv)
    root = Path(args.root) if args.root else trace.repository_root(args.target)
    t0 = time.perf_counter()
    statement = attestation.build_statement(args.target, root)
    path = attestation.write_statement(statement, attestation.statement_path(args.target, root))
    sig = attestation.sign(path, args.key, os.environ.get("BERTRACE_SIGNING_KEY_PASSWORD"))
    if Path(args.target).is_dir():  # an export: its model card names the attestation
        from pipeline.core.io import sha256_file
        from pipeline.interop.model_card import note_attestation

        note_attestation(Path(args.target), sha256_file(path))
    print(
        f"attested {len(statement['subject'])} file(s) with "
        f"{len(statement['predicate']['buildDefinition']['resolvedDependencies'])} materials: {path} "
        f"({path.stat().st_size:,} bytes), signature {sig} ({time.perf_counter() - t0:.2f} s)"
    )
    return 0


def main_verify(argv: list[str] | None = None) -> int:
    args = _parser("bertrace verify-attestation", "the public key (PEM) of the key that signed it").parse_args(argv)
    root = Path(args.root) if args.root else trace.repository_root(args.target)
    t0 = time.perf_counter()
    failures, notes = attestation.verify(args.target, args.key, root)
    for line in notes:
        print(f"note: {line}")
    for line in failures:
        print(f"FAILED {line}")
    if failures:
        return 1
    print(
        f"verified {attestation.statement_path(args.target, root)}: signature, subjects and materials "
        f"({time.perf_counter() - t0:.2f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main_attest())
