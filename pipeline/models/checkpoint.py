"""Checkpoint files: the one module that writes, reads and tells apart bertrace's ``.pt`` checkpoints.

Every checkpoint is one ``torch.save`` file of a dict holding only tensors, numbers, strings, lists
and dicts, so ``torch.load(path, weights_only=True)`` reads it without unpickling code
(docs/formats.md "Pre-training checkpoint", "Fine-tuned checkpoint"):

* a pre-training checkpoint (:func:`save_checkpoint`, format ``bertrace-pretrain-checkpoint``):
  ``model`` / ``optimizer`` / ``scaler`` state dicts, ``model_config`` (``BertConfig.to_dict``),
  ``train_config`` (the ``PretrainConfig`` as a dict), progress (``step``, ``tokens_seen``,
  ``data_position``), ``rng`` (:func:`rng_state` of every rank), ``best_<metric>``, ``history``,
  ``metrics``, and ``provenance`` with ``tokenizer_sha256`` and ``examples_manifest_sha256`` always
  present. No times: for a step or epoch budget a checkpoint is a function of the code, params and
  data, the same bytes on every rebuild; a run the wall clock governs also keeps ``train_seconds``;
* a fine-tuned ``model.pt`` (:func:`save_finetuned`, format ``bertrace-finetune-checkpoint``): the
  classifier's weights, ``model_config``, ``architecture``, ``num_labels``, ``label_names``, ``task``,
  ``tokenizer_sha256``, ``mode``, ``seed``, ``metrics``, ``provenance``.

Files are written with :func:`pipeline.core.io.atomic_path` (temporary file in the same directory,
fsync, rename): a kill at any moment leaves either the previous checkpoint or the new one. Reading
(:func:`read_checkpoint`) passes every dict through :func:`upgrade`, which turns the layouts older
code wrote into the current one, so the readers below rely on the current layout only.
"""

from __future__ import annotations

import contextlib
import errno
import json
import pickle
import random
import sys
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.core.errors import BertraceError
from pipeline.core.io import DiskFull, atomic_path, free_bytes, sha256_file

FORMAT = "bertrace-pretrain-checkpoint"
FINETUNE_FORMAT = "bertrace-finetune-checkpoint"
VERSION = 1
LAST, BEST = "last.pt", "best.pt"
FINETUNE_KEYS = ("model", "model_config", "num_labels", "label_names", "task", "tokenizer_sha256")
WRAPPER_PREFIXES = ("_orig_mod.", "module.")  # torch.compile's and DDP's state-dict key prefixes


# ----------------------------------------------------------------------------- RNG states


def rng_state() -> dict[str, Any]:
    """This process's RNG states in ``weights_only``-safe types (tensors, ints, lists): a checkpoint's ``rng``."""
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


# ----------------------------------------------------------------------------- write


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> Path:
    """Atomically write the pre-training checkpoint ``state`` (plus format tags) to ``path``.

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


def _plain(obj: Any) -> Any:
    """JSON-able copy (str for anything exotic) so ``torch.load(weights_only=True)`` reads it."""
    return json.loads(json.dumps(obj, default=str))


def save_finetuned(
    path: str | Path,
    *,
    state_dict: dict[str, torch.Tensor],
    model_config: dict,
    label_names: list[str],
    task: dict,
    tokenizer_sha256: str,
    mode: str,
    seed: int,
    metrics: dict,
    provenance: dict,
    num_labels: int | None = None,
    architecture: str = "bert",
) -> Path:
    """Write ``model.pt`` atomically: tensors, numbers, strings, lists, dicts only. ``num_labels``
    (the head's outputs) defaults to ``len(label_names)``; a regression head has 1 and no names;
    ``task["type"]`` names the task type; ``architecture`` (:func:`architecture`): ``bert`` (an
    encoder; ``model_config`` says how it pools) or ``gpt`` (a decoder, last-token pooling)."""
    path = Path(path)
    state = {
        "format": FINETUNE_FORMAT,
        "version": VERSION,
        "model": {k: v.detach().cpu().contiguous() for k, v in state_dict.items()},
        "model_config": _plain(model_config),
        "architecture": architecture,
        "num_labels": len(label_names) if num_labels is None else int(num_labels),
        "label_names": [str(n) for n in label_names],
        "task": _plain(task),
        "tokenizer_sha256": tokenizer_sha256,
        "mode": mode,
        "seed": int(seed),
        "metrics": _plain(metrics),
        "provenance": _plain(provenance),
    }
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        torch.save(state, f)  # a file object: the bytes do not depend on the temporary name
    return path


# ----------------------------------------------------------------------------- read

_MISSING = {
    False: "checkpoint not found; check the path (the finetune stage writes data/finetune/model.pt, "
    "the pretrain stage data/pretrain/best.pt)",
    True: "checkpoint not found; run the pretrain stage first (dvc repro pretrain)",
}
_UNREADABLE = {
    False: "not a readable checkpoint ({}); rerun the stage that wrote it or restore it with `dvc checkout`",
    True: "not a readable checkpoint (corrupt, truncated or not a torch file: {}); delete it (and start "
    "pre-training over) or restore it from a backup / `dvc checkout`",
}


def read_checkpoint(
    path: str | Path, map_location: str | torch.device = "cpu", *, pretraining: bool = False
) -> dict[str, Any]:
    """A bertrace checkpoint as a dict (``weights_only`` load), :func:`upgrade` d to the current layout;
    a clear error for a missing, corrupt or foreign file. ``pretraining``: it must be a pre-training
    checkpoint of this :data:`VERSION` (resume, fine-tuning), and the errors say how to make one."""
    path = Path(path)
    if not path.is_file():
        raise BertraceError(f"{path}: {_MISSING[pretraining]}")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile, pickle.UnpicklingError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BertraceError(f"{path}: " + _UNREADABLE[pretraining].format(first)) from None
    if pretraining:
        check_pretraining(ckpt, path)
    elif not isinstance(ckpt, dict) or "model" not in ckpt or "model_config" not in ckpt:
        raise BertraceError(f"{path}: not a bertrace checkpoint (expected a dict with 'model' and 'model_config')")
    return upgrade(ckpt)


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The pre-training checkpoint at ``path`` (:func:`read_checkpoint` with ``pretraining``)."""
    return read_checkpoint(path, map_location, pretraining=True)


def check_pretraining(ckpt: Any, path: str | Path) -> None:
    """BertraceError unless ``ckpt`` carries the pre-training format tag and this :data:`VERSION`."""
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise BertraceError(f"{path}: not a bertrace pre-training checkpoint (no '{FORMAT}' tag)")
    if ckpt.get("version") != VERSION:
        raise BertraceError(
            f"{path}: checkpoint version {ckpt.get('version')}, this code reads {VERSION}; "
            "re-run pre-training with this version of bertrace"
        )


def upgrade(ckpt: dict[str, Any]) -> dict[str, Any]:
    """``ckpt`` (as read from a file) in the current layout, changed in place; a checkpoint that is
    already current comes back unchanged. The older layouts:

    * ``model`` keys with torch.compile's ``_orig_mod.`` or DDP's ``module.`` prefix: stripped;
    * a fine-tuned checkpoint without ``architecture`` (written before GPT fine-tuning): ``bert``;
    * a fine-tuned checkpoint whose ``task`` has no ``type`` (before token classification and
      regression): ``classification``;
    * a pre-training checkpoint whose ``train_config`` has no ``objective`` (before objectives):
      its provenance's ``params.objective``, else ``mlm_nsp`` (BERT's)."""
    model = ckpt.get("model")
    if isinstance(model, dict) and any(str(k).startswith(WRAPPER_PREFIXES) for k in model):
        ckpt["model"] = unwrapped_state_dict(model)
    if is_finetuned(ckpt):
        ckpt.setdefault("architecture", "bert")
        task = ckpt.get("task")
        if isinstance(task, dict) and not task.get("type"):
            ckpt["task"] = {**task, "type": "classification"}
        return ckpt
    train = ckpt.get("train_config") or {}
    if not train.get("objective"):
        params = (ckpt.get("provenance") or {}).get("params") or {}
        ckpt["train_config"] = {**train, "objective": str(params.get("objective") or "mlm_nsp")}
    return ckpt


def resolve_checkpoint(path: str | Path) -> Path:
    """``path`` when it exists, else ``last.pt`` next to it (a run without a best.pt yet)."""
    path = Path(path)
    if path.is_file():
        return path
    last = path.with_name(LAST)
    if path.name != LAST and last.is_file():
        return last
    raise BertraceError(
        f"{path}: pre-training checkpoint not found (nor {last}); run the pretrain stage "
        "(dvc repro pretrain) or set finetune.checkpoint"
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


# ----------------------------------------------------------------------------- kinds


def is_finetuned(ckpt: dict[str, Any]) -> bool:
    return "num_labels" in ckpt


def check_finetuned(ckpt: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """``ckpt`` if it has every key of the fine-tuned format (docs/formats.md "Fine-tuned checkpoint"), else a clear error."""
    missing = [k for k in FINETUNE_KEYS if k not in ckpt]
    if missing:
        kind = "a pre-training checkpoint" if not is_finetuned(ckpt) else "an incomplete fine-tuned checkpoint"
        raise BertraceError(
            f"{path}: {kind} (missing {missing}); classify with a fine-tuned model.pt "
            "(data/finetune/model.pt, written by the finetune stage)"
        )
    return ckpt


def load_finetuned(path: str | Path) -> dict[str, Any]:
    """The fine-tuned checkpoint dict; BertraceError for a missing, corrupt or wrong kind of file."""
    return check_finetuned(read_checkpoint(path), path)


def load_pretrained(path: str | Path) -> dict[str, Any]:
    """The pre-training checkpoint (:func:`load_checkpoint`), checked for the keys fine-tuning needs."""
    path = Path(path)
    ckpt = load_checkpoint(path)
    missing = [k for k in ("model", "model_config") if k not in ckpt]
    if missing:
        raise BertraceError(f"{path}: pre-training checkpoint lacks {missing}; rerun the pretrain stage")
    return ckpt


def checkpoint_objective(ckpt: dict[str, Any]) -> str:
    """The objective a pre-training checkpoint was trained with: ``train_config.objective``
    (:func:`upgrade` fills it in every checkpoint read); a checkpoint imported from Hugging Face
    (:mod:`pipeline.interop.hf_import`, never read from a file) has no ``train_config``: ``mlm_nsp``."""
    return str(ckpt["train_config"]["objective"]) if "train_config" in ckpt else "mlm_nsp"


def architecture(ckpt: dict[str, Any]) -> str:
    """``gpt`` for a causal (``clm``) checkpoint, ``bert`` otherwise: what the fine-tuned model.pt records."""
    if is_finetuned(ckpt):
        return str(ckpt["architecture"])
    return "gpt" if checkpoint_objective(ckpt) == "clm" else "bert"


def is_causal_checkpoint(ckpt: dict[str, Any]) -> bool:
    """A ``clm`` (GPT decoder) pre-training checkpoint, or a fine-tuned model.pt built on one."""
    return architecture(ckpt) == "gpt"


def is_causal_state_dict(state_dict: dict[str, Any]) -> bool:
    """Whether a checkpoint's state dict is a GPT (``wte.*``) or a GPT classifier (``gpt.*``)."""
    return any(k == "wte.weight" or k.startswith("gpt.") for k in state_dict)


# ----------------------------------------------------------------------------- weights, tokenizer, data


def unwrapped_state_dict(state_dict: dict[str, Any]) -> dict[str, Any]:
    """Drop the key prefixes torch.compile (``_orig_mod.``) and DDP (``module.``) add."""
    out = {}
    for k, v in state_dict.items():
        while k.startswith(WRAPPER_PREFIXES):
            k = k.split(".", 1)[1]
        out[k] = v
    return out


def load_weights(model: torch.nn.Module, state_dict: dict[str, Any], path: str | Path) -> None:
    """Load a read checkpoint's ``model`` into ``model``; BertraceError when they do not fit."""
    try:
        model.load_state_dict(state_dict)
    except RuntimeError as e:
        raise BertraceError(
            f"{path}: weights do not fit its model_config ({str(e).splitlines()[0]}); "
            "the checkpoint is inconsistent, rerun the stage that wrote it"
        ) from None


def check_tokenizer_hash(tokenizer_path: str | Path, expected_sha256: str | None, checkpoint_path: str | Path) -> str:
    """sha256 of ``tokenizer_path``; BertraceError naming both hashes when it is not the
    tokenizer the checkpoint was trained with."""
    tokenizer_path = Path(tokenizer_path)
    if not tokenizer_path.is_file():
        raise BertraceError(
            f"{tokenizer_path}: tokenizer not found; the fine-tuned checkpoint {checkpoint_path} "
            "needs the tokenizer.json it was trained with next to it (the finetune stage writes both)"
        )
    actual = sha256_file(tokenizer_path)
    if expected_sha256 and actual != expected_sha256:
        raise BertraceError(
            f"{tokenizer_path}: sha256 {actual} is not the tokenizer {checkpoint_path} was trained with "
            f"(sha256 {expected_sha256}); put the matching tokenizer.json next to the checkpoint "
            "(rerun the finetune stage or `dvc checkout`)"
        )
    return actual


def check_checkpoint_tokenizer(ckpt: dict[str, Any], ckpt_path: str | Path, tokenizer_path: str | Path) -> str:
    """The task tokenizer's sha256; BertraceError naming both hashes when the pre-training checkpoint
    was pre-trained with another tokenizer (its ids would mean different tokens)."""
    tokenizer_path = Path(tokenizer_path)
    if not tokenizer_path.is_file():
        raise BertraceError(f"{tokenizer_path}: tokenizer not found; run the tokenizer stage or set finetune.tokenizer")
    actual = sha256_file(tokenizer_path)
    expected = (ckpt.get("provenance") or {}).get("tokenizer_sha256")
    if not expected:
        raise BertraceError(
            f"{ckpt_path}: records no tokenizer_sha256 in its provenance, so the tokenizer it was "
            "pre-trained with is unknown; rerun the pretrain stage"
        )
    if actual != expected:
        raise BertraceError(
            f"tokenizer mismatch: {ckpt_path} was pre-trained with tokenizer sha256 {expected}, but "
            f"{tokenizer_path} has sha256 {actual}; fine-tune with the tokenizer the checkpoint was trained with "
            "(finetune.tokenizer, or `dvc checkout` the matching data/tokenizer) or pre-train again"
        )
    return actual


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
