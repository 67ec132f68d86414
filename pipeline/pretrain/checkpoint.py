"""Pre-training checkpoints: atomic, ``weights_only``-loadable, traceable to their data.

A checkpoint is one ``torch.save`` file holding only tensors, numbers, strings, lists and
dicts, so ``torch.load(path, weights_only=True)`` reads it without unpickling code:

* ``model`` / ``optimizer`` / ``scaler`` state dicts, ``model_config`` (``BertConfig.to_dict``),
  ``train_config`` (the ``PretrainConfig`` as a dict);
* progress: ``step`` (optimizer updates), ``tokens_seen``, ``train_seconds``, ``data_position``
  (``epoch``, ``batch`` consumed in it, the world size and per-rank batch it refers to);
* ``rng``: the torch CPU / CUDA, numpy and python ``random`` states of every rank;
* ``best_val_mlm_loss``, ``history`` (the loss curve so far), ``metrics`` (latest validation);
* ``provenance``: the caller's record (git commit + dirty flag, params and their hash, ...)
  with ``tokenizer_sha256`` and ``examples_manifest_sha256`` always present.

Files are written with :func:`pipeline.core.io.atomic_path` (temporary file in the same
directory, fsync, rename): a kill at any moment leaves either the previous checkpoint or
the new one, never a torn file.
"""

from __future__ import annotations

import contextlib
import errno
import pickle
import random
import zipfile
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
            # and the temporary name is random, so a path would give other bytes for the same state.
            f = _WriteErrors(raw)
            try:
                torch.save({"format": FORMAT, "version": VERSION, **state}, f)
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
