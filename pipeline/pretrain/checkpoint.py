"""Pre-training checkpoints: atomic, ``weights_only``-loadable, traceable to their data.

A checkpoint is one ``torch.save`` file holding only tensors, numbers, strings, lists and
dicts, so ``torch.load(path, weights_only=True)`` reads it without unpickling code:

* ``model`` / ``optimizer`` / ``scaler`` state dicts, ``model_config`` (``BertConfig.to_dict``),
  ``train_config`` (the ``PretrainConfig`` as a dict);
* progress: ``step`` (optimizer updates), ``tokens_seen``, ``data_position`` (``epoch``, ``batch``
  consumed in it, the world size and per-rank batch it refers to);
* ``rng``: the torch CPU / CUDA, numpy and python ``random`` states of every rank;
* ``best_val_mlm_loss``, ``history`` (the loss curve so far), ``metrics`` (latest validation);
* ``provenance``: the caller's record (params and their hash, inputs, ...) with
  ``tokenizer_sha256`` and ``examples_manifest_sha256`` always present.

No times: for a step or epoch budget a checkpoint is a function of the code, params and data, the
same bytes on every rebuild. A run the wall clock governs (``time_minutes``, ``snapshot_minutes``,
``checkpoint_minutes``; not reproducible anyway) also keeps ``train_seconds``, the training time its
resume continues from.

Files are written with :func:`pipeline.core.io.atomic_path` (temporary file in the same
directory, fsync, rename): a kill at any moment leaves either the previous checkpoint or
the new one, never a torn file. :func:`publish_dir` gives a finished run's directory to DVC.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pickle
import random
import secrets
import shutil
import sys
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.core.errors import BertraceError
from pipeline.core.io import DiskFull, atomic_path, free_bytes

FORMAT = "bertrace-pretrain-checkpoint"
VERSION = 1
LAST, BEST = "last.pt", "best.pt"


# ----------------------------------------------------------------------------- RNG states


def rng_state() -> dict[str, Any]:
    """This process's RNG states in ``weights_only``-safe types (tensors, ints, lists)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    py_version, py_state, py_gauss = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(gauss),
        },
        "python": {"version": py_version, "state": list(py_state), "gauss_next": py_gauss},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(
        (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss_next"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"][: torch.cuda.device_count()])


# ----------------------------------------------------------------------------- save / load


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> Path:
    """Atomically write ``state`` (plus format tags) to ``path``.

    A full disk (or quota) is a :class:`BertraceError` naming ``path``, the space the checkpoint
    needs and the space free; the temporary file is removed and the previous ``path`` is left as
    it was (``atomic_path``). torch reports a failed write of its zip records as ``RuntimeError:
    [enforce fail at inline_container.cc] ... unexpected pos``: the file object below keeps the
    ``OSError`` behind it."""
    path = Path(path)
    try:
        with atomic_path(path) as tmp, open(tmp, "wb") as raw:
            # A file object, not a path: torch.save names the zip records after the file it writes,
            # and the temporary name is random, so a path would give other bytes for the same state
            # (and _canonical: the pickle follows the values, not which objects hold them).
            f = _WriteErrors(raw)
            try:
                torch.save(_canonical({"format": FORMAT, "version": VERSION, **state}), f)
            except RuntimeError as e:
                if f.error is not None:
                    raise f.error from e
                raise
    except DiskFull as e:
        raise BertraceError(_no_space(path, state_bytes(state), e.error)) from None
    except (OSError, RuntimeError) as e:
        needed = state_bytes(state)
        full = isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)
        # torch's write failure without the OSError behind it, or another error: a full disk if the
        # space still free (the temporary is gone) could not hold the checkpoint
        writing = isinstance(e, OSError) or "inline_container" in str(e) or "PytorchStreamWriter" in str(e)
        if not (full or (writing and _nearly_full(path, needed))):
            raise
        raise BertraceError(_no_space(path, needed, e)) from None
    return path


def _canonical(obj: Any) -> Any:
    """``obj`` with its dicts, lists and tuples rebuilt and every string interned, so that its pickle is
    a function of its values: pickle writes a second reference to one object as a back-reference, and a
    resumed run's strings are unpickled copies where an uninterrupted run's are shared literals."""
    if type(obj) is str:
        return sys.intern(obj)
    if type(obj) in (dict, OrderedDict):  # an OrderedDict: a state_dict, with its _metadata
        out = type(obj)((_canonical(k), _canonical(v)) for k, v in obj.items())
        if hasattr(obj, "_metadata"):
            out._metadata = _canonical(obj._metadata)
        return out
    if type(obj) in (list, tuple):
        return type(obj)(_canonical(v) for v in obj)
    return obj


class _WriteErrors:
    """A binary file that remembers the ``OSError`` its ``write`` raised (torch turns it into a
    RuntimeError without the errno); everything else is the file's."""

    def __init__(self, f):
        self._f, self.error = f, None

    def write(self, data) -> int:
        try:
            return self._f.write(data)
        except OSError as e:
            self.error = e
            raise

    def __getattr__(self, name):
        return getattr(self._f, name)


def state_bytes(obj: Any) -> int:
    """Bytes of the tensors in a (nested) state: about the size of its checkpoint file."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(state_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(state_bytes(v) for v in obj)
    return 0


def _nearly_full(path: Path, needed: int) -> bool:
    free = free_bytes(path)
    return free is not None and free < needed + (1 << 20)


def _no_space(path: Path, needed: int, e: BaseException) -> str:
    free = free_bytes(path)
    old = f"the previous {path.name} is intact" if path.exists() else f"no {path.name} was written"
    return (
        f"{path}: no space left on the device to write the checkpoint (it needs about {needed / 2**20:,.1f} MiB, "
        f"{'unknown' if free is None else f'{free / 2**20:,.1f} MiB'} free in {path.parent}; "
        f"{type(e).__name__}: {' '.join(str(e).split())[:100]}); {old}. Free some space (or move "
        f"{path.parent} to a larger disk) and rerun: training resumes from the last checkpoint"
    )


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True``; a clear error when missing or corrupt."""
    path = Path(path)
    if not path.is_file():
        raise BertraceError(f"{path}: checkpoint not found; run the pretrain stage first (dvc repro pretrain)")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile, pickle.UnpicklingError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BertraceError(
            f"{path}: not a readable checkpoint (corrupt, truncated or not a torch file: {first}); "
            f"delete it (and start pre-training over) or restore it from a backup / `dvc checkout`"
        ) from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise BertraceError(f"{path}: not a bertrace pre-training checkpoint (no '{FORMAT}' tag)")
    if ckpt.get("version") != VERSION:
        raise BertraceError(
            f"{path}: checkpoint version {ckpt.get('version')}, this code reads {VERSION}; "
            "re-run pre-training with this version of bertrace"
        )
    return ckpt


def check_data_matches(
    ckpt: dict[str, Any],
    path: str | Path,
    *,
    tokenizer_sha256: str,
    manifest_sha256: str,
    manifest_path: str | Path = "data/examples/manifest.json",
) -> None:
    """Refuse to resume (or evaluate) on different data than the checkpoint was trained on."""
    prov = ckpt.get("provenance") or {}
    problems = []
    if prov.get("tokenizer_sha256") != tokenizer_sha256:
        problems.append(
            f"tokenizer sha256 {prov.get('tokenizer_sha256')} in the checkpoint, "
            f"{tokenizer_sha256} now (from {manifest_path})"
        )
    if prov.get("examples_manifest_sha256") != manifest_sha256:
        problems.append(
            f"examples manifest sha256 {prov.get('examples_manifest_sha256')} in the checkpoint, "
            f"{manifest_sha256} now ({manifest_path})"
        )
    if problems:
        ckpt_dir = Path(path).parent
        raise BertraceError(
            f"{path}: was trained on different data: " + "; ".join(problems) + ". "
            f"To pre-train from scratch on the current data delete {ckpt_dir} (rm -r {ckpt_dir}); "
            "to continue this checkpoint point the examples directory at the data it was trained on "
            "(e.g. `git checkout` + `dvc checkout` the matching commit)"
        )


def remove_stale_temporaries(directory: str | Path, names: tuple[str, ...] = (LAST, BEST)) -> int:
    """Delete the temporaries (``.<name>.*.tmp``, see :func:`pipeline.core.io.atomic_path`) that a
    killed run left next to the files ``names`` in ``directory``; returns how many."""
    removed = 0
    directory = Path(directory)
    if not directory.is_dir():
        return 0
    for name in names:
        for tmp in directory.glob(f".{name}.*.tmp"):
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
                removed += 1
    return removed


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
