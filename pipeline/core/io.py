"""Small file utilities: atomic writes and content hashes.

Every output of bertrace is written to a temporary file in the destination's directory
and renamed into place, so a crash or kill never leaves a half-written file behind. A full
disk while writing one is a :class:`DiskFull` error naming the file and the space free (the
previous file is left as it was).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

from pipeline.core.errors import BertraceError

_CHUNK = 1 << 20
_FULL = (errno.ENOSPC, errno.EDQUOT)


class DiskFull(BertraceError):
    """No space left (or quota exceeded) while writing ``path``; ``error`` is the OSError."""

    def __init__(self, path: Path, error: OSError, existed: bool):
        self.path, self.error = Path(path), error
        free = free_bytes(self.path)
        where = "unknown" if free is None else f"{free / 2**20:,.1f} MiB"
        kept = f"the previous {self.path.name} is unchanged" if existed else "nothing was written"
        super().__init__(
            f"{self.path}: no space left on the device while writing it ({where} free in "
            f"{self.path.parent}; {error.strerror or error}); {kept}. Free some space (or point the "
            "output at a larger disk) and rerun the stage"
        )


def free_bytes(path: str | os.PathLike) -> int | None:
    """Free bytes on the filesystem of ``path`` (or of its nearest existing parent)."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return shutil.disk_usage(probe).free
    except OSError:
        return None


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_json(obj: Any) -> str:
    """Hash of an object's canonical JSON form (sorted keys, no whitespace)."""
    return sha256_bytes(canonical_json(obj).encode("utf-8"))


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success fsync and rename it into place.

    On any exception the temporary file is removed and ``path`` is left untouched; a full disk
    (``ENOSPC`` / ``EDQUOT``) becomes :class:`DiskFull`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        if e.errno in _FULL:
            raise DiskFull(path, e, path.exists()) from None
        raise
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb") as f:
            os.fsync(f.fileno())
        os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp creates 0600; give the usual mode
        os.replace(tmp_path, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        if isinstance(e, OSError) and e.errno in _FULL:
            raise DiskFull(path, e, path.exists()) from None
        raise


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8"):
    """Open a temporary file for writing that replaces ``path`` atomically on close."""
    binary = "b" in mode
    with atomic_path(path) as tmp:
        with open(tmp, mode, encoding=None if binary else encoding, newline=None if binary else "\n") as f:
            yield f


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write pretty JSON atomically (sorted keys, trailing newline)."""
    with atomic_open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True, ensure_ascii=False, default=str)
        f.write("\n")


def read_json(path: str | os.PathLike) -> Any:
    path = Path(path)
    if not path.exists():
        raise BertraceError(f"{path}: file not found")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise BertraceError(f"{path}: not valid JSON ({e}); delete it and rerun the stage that writes it") from None
