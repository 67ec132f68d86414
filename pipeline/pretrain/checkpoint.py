"""The pretrain stage's work directory: its checkpoints published to DVC, and kept only for the code that wrote them.

The checkpoint files themselves (format, atomic writes, reading) are :mod:`pipeline.models.checkpoint`'s.
The stage trains in a work directory that outlives DVC's removal of its outputs (resume):
:func:`publish_dir` gives a finished run's directory to DVC, :func:`forget_other_code` empties a work
directory that other code of the stage wrote.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from pathlib import Path

from pipeline.core.errors import BertraceError
from pipeline.core.io import atomic_path
from pipeline.models.checkpoint import LAST

# ----------------------------------------------------------------------------- publish


def publish_dir(src: str | Path, dst: str | Path) -> Path:
    """Replace the directory ``dst`` with the files of ``src`` (every file under it but hidden ones,
    the temporaries of :func:`pipeline.core.io.atomic_path`), atomically: a failure at any point
    leaves the previous ``dst`` as it was and no temporary behind.

    The stage trains in a work directory that outlives DVC's removal of its outputs (resume) and
    publishes it to ``data/pretrain``: the files are hard-linked (copied when linking fails, e.g.
    across filesystems) into a sibling temporary directory, fsynced, and renamed into place.
    Hard links are safe because every checkpoint write is an atomic rename (a new inode), never
    an in-place edit: the next run's ``last.pt`` never changes the bytes published (or cached by
    DVC) before it."""
    src, dst = Path(src), Path(dst)
    if not src.is_dir():
        raise BertraceError(f"{src}: no such directory to publish to {dst}; rerun the stage that trains into it")
    dst.parent.mkdir(parents=True, exist_ok=True)
    for stale in [*dst.parent.glob(f".{dst.name}.*.tmp"), *dst.parent.glob(f".{dst.name}.*.old")]:
        shutil.rmtree(stale, ignore_errors=True)  # left by a publish that was killed
    tmp = dst.parent / f".{dst.name}.{secrets.token_hex(6)}.tmp"
    tmp.mkdir()
    try:
        for file in sorted(p for p in src.rglob("*") if p.is_file() and not _hidden(p.relative_to(src))):
            target = tmp / file.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(file, target)  # safe: a checkpoint is replaced by a rename, never edited in place
            except OSError:
                shutil.copyfile(file, target)
            with open(target, "rb") as f:
                os.fsync(f.fileno())
        for directory in [*sorted((p for p in tmp.rglob("*") if p.is_dir()), reverse=True), tmp]:
            _fsync_dir(directory)
        if not (dst.exists() or dst.is_symlink()):
            os.replace(tmp, dst)
        else:  # moved aside, not deleted, until the new one is in place
            old = dst.parent / f".{dst.name}.{secrets.token_hex(6)}.old"
            os.replace(dst, old)
            try:
                os.replace(tmp, dst)
            except BaseException:
                os.replace(old, dst)
                raise
            if old.is_dir() and not old.is_symlink():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.unlink()
        _fsync_dir(dst.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dst


CODE_STAMP = ".code.json"  # in the work directory: the stage's code hashes of the run that wrote it (not published)


def forget_other_code(work: str | Path, code: dict[str, str], resume: bool | str) -> str | None:
    """Keep ``work``'s checkpoints only if this code wrote them: exact resume continues a run under
    the code that started it. ``code`` is the stage's ``{path: sha256}`` (its dvc.yaml code deps).
    With ``resume: auto`` a work directory written by other code is emptied (a new run, as in a
    fresh clone); with ``resume: true`` it is kept (the user insists). Stamps ``work`` with ``code``;
    returns a line saying what it did, or None."""
    work = Path(work)
    stamp = work / CODE_STAMP
    note = None
    if (work / LAST).exists():
        try:
            before = json.loads(stamp.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            before = None
        if before != code:
            changed = sorted(p for p in set(code) | set(before or {}) if (before or {}).get(p) != code.get(p))
            what = ", ".join(changed[:4]) + (" …" if len(changed) > 4 else "") if before else "unknown code"
            if resume == "auto":
                shutil.rmtree(work)
                note = f"{work}: its checkpoints were made by other code of this stage ({what}): starting over"
            elif resume:
                note = (
                    f"{work}: resuming checkpoints made by other code of this stage ({what}); pretrain.resume is true"
                )
    work.mkdir(parents=True, exist_ok=True)
    with atomic_path(stamp) as tmp:
        Path(tmp).write_text(json.dumps(code, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return note


def _hidden(rel: Path) -> bool:
    return any(part.startswith(".") for part in rel.parts)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # not every filesystem (or OS) lets a directory be fsynced
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
