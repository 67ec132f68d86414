"""The Hugging Face hub and its local mirrors, for the corpus (download) and the task data (finetune).

One place for what both need: offline detection, one rule for what counts as a network error,
one help text when the hub cannot be reached, revision pinning (a branch or tag resolves to the
commit sha that provenance records) and loading a split. Offline machines point a *mirror*
(``download.mirror`` / ``finetune.mirror`` or env ``BERTRACE_HUB_MIRROR``) at local copies:

* a YAML index ``dataset id -> config -> split -> file`` (paths relative to the YAML file; an
  entry may be ``{path: file, columns: {old: new}}`` to rename a copy's columns to the hub's), or
* a directory laid out ``<mirror>/<dataset id>/<config>/<split>.<ext>``.

Relative paths resolve from the repository root wherever DVC runs the stage: ``dvc exp run --temp``
and ``--queue`` run it in a copy of the tracked files (``.dvc/tmp/exps/<tmp>/``), where a mirror's
``../../shared/data/...`` would point inside ``.dvc/tmp``; :func:`repo_path` takes a relative path
that leaves that copy from the original repository (``DVC_ROOT``) instead.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Iterable

import yaml

from pipeline.core.errors import BertraceError

log = logging.getLogger("bertrace.hub")

MIRROR_SUFFIXES = ("raw", "txt", "tokens", "parquet", "jsonl", "json", "tsv", "csv")
SPLIT_ALIASES = {
    "validation": ("validation", "valid", "val", "dev"),
    "valid": ("valid", "validation", "val", "dev"),
    "dev": ("dev", "validation", "valid", "val"),
}
# Exception class names (anywhere in the MRO) that mean "the hub could not be reached".
NETWORK_ERRORS = {
    "ConnectionError",
    "TimeoutError",
    "OfflineModeIsEnabled",
    "LocalEntryNotFoundError",
    "TransportError",
    "TimeoutException",
    "NetworkError",
    "ConnectError",
}


MIRROR_ENV = "BERTRACE_HUB_MIRROR"


def configured_mirror(param: str | None) -> str | None:
    """The hub mirror a stage reads: its ``mirror`` param, else env ``BERTRACE_HUB_MIRROR``, else None (the hub)."""
    return param or os.environ.get(MIRROR_ENV) or None


def hub_offline() -> bool:
    """Whether huggingface_hub or datasets is in offline mode (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE)."""
    import datasets.config as dc
    import huggingface_hub.constants as hc

    return bool(hc.HF_HUB_OFFLINE or dc.HF_HUB_OFFLINE or getattr(dc, "HF_DATASETS_OFFLINE", False))


def is_network_error(e: BaseException) -> bool:
    """The one rule: a network-ish exception class, or "dataset not found" while offline mode is
    on (``datasets`` then cannot tell a missing dataset from one it may not fetch)."""
    names = {c.__name__ for c in type(e).__mro__}
    return bool(names & NETWORK_ERRORS) or ("DatasetNotFoundError" in names and hub_offline())


def unreachable_help(dataset: str, config: str | None, reason: str, section: str) -> str:
    """What to do when the hub cannot be reached; ``section`` is ``download`` or ``finetune``."""
    if section == "download":
        local = (
            "in params.yaml set `download.source: local` and `download.local.path` to a file,\n"
            "    directory or glob (e.g. `download.local.path: data/sources/wiki.test.raw`)"
        )
    else:
        local = (
            "in params.yaml set `finetune.task.source: local` and\n"
            "    `finetune.task.local: {train: file, validation: file}`"
        )
    return (
        f"cannot reach the Hugging Face hub for dataset {dataset!r} ({reason}). Either\n"
        f"  * use local files: {local}, or\n"
        f"  * use a mirror of the hub dataset: `BERTRACE_HUB_MIRROR=mirrors/shared-data.yaml dvc repro` or\n"
        f"    `{section}.mirror: mirrors/shared-data.yaml` in params.yaml; the YAML maps dataset -> config -> split\n"
        f"    -> file, e.g.\n"
        f"        {dataset}:\n"
        f"          {config or 'default'}:\n"
        f"            test: ../data/wiki.test.raw\n"
        f"    (a directory <mirror>/{dataset}/{config or 'default'}/<split>.<ext> works too), or\n"
        + (
            "  * offline mode is on (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE) and the dataset is not in the Hugging\n"
            "    Face cache (HF_HOME): unset offline mode where the hub is reachable."
            if hub_offline()
            else "  * if the dataset is already in your Hugging Face cache, set HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1."
        )
    )


def resolve_revision(dataset: str, config: str | None, revision: str, *, key: str) -> str | None:
    """Commit sha ``revision`` points to (None offline or for a local dataset folder). One quick
    request, no retries: an unreachable hub fails here in well under a second instead of in
    ``load_dataset``'s retry loop. ``key`` is the params.yaml key of the dataset section
    (``download.hub`` / ``finetune.task.hub``), for error messages."""
    if hub_offline() or Path(dataset).is_dir():
        return None
    from huggingface_hub import HfApi

    try:
        return HfApi().dataset_info(dataset, revision=revision, timeout=15).sha
    except Exception as e:  # noqa: BLE001 - turned into a user-facing message below
        names = {c.__name__ for c in type(e).__mro__}
        if "RevisionNotFoundError" in names:
            raise BertraceError(
                f"hub dataset {dataset!r} has no revision {revision!r}; "
                f"fix {key}.revision (a branch, tag or commit sha)"
            ) from None
        if "GatedRepoError" in names:
            raise BertraceError(
                f"hub dataset {dataset!r} is gated; accept its terms on huggingface.co and "
                "log in (`hf auth login`), or use a mirror / local files"
            ) from None
        if "RepositoryNotFoundError" in names:
            raise BertraceError(f"hub dataset {dataset!r} not found (or private); fix {key}.dataset") from None
        if is_network_error(e):
            raise BertraceError(
                unreachable_help(dataset, config, f"{type(e).__name__}: {e}", key.split(".")[0])
            ) from None
        raise


def load_split(dataset: str, config: str | None, revision: str, split: str, *, key: str):
    """``datasets.load_dataset(dataset, config, revision, split)`` with user-facing errors (``key``
    as in :func:`resolve_revision`)."""
    import datasets

    name = f"{dataset}/{config}" if config else dataset
    try:
        return datasets.load_dataset(dataset, config, revision=revision, split=split)
    except Exception as e:  # noqa: BLE001
        if isinstance(e, ValueError) and "split" in str(e).lower():
            splits_key = "download.hub.splits" if key.startswith("download") else "finetune.task.splits"
            raise BertraceError(f"hub dataset {name}: {e}; fix {splits_key}") from None
        if is_network_error(e):
            raise BertraceError(
                unreachable_help(dataset, config, f"{type(e).__name__}: {e}", key.split(".")[0])
            ) from None
        raise


# ---------------------------------------------------------------------------------------------
# Mirrors
# ---------------------------------------------------------------------------------------------
def resolve_mirror(
    mirror: str | os.PathLike, dataset: str, config: str | None, splits: Iterable[str]
) -> dict[str, Path]:
    """Local copies of ``dataset``/``config`` splits in a hub mirror: ``{split: path}``.

    A mirror is either

    * a YAML index ``dataset id -> config -> split -> file`` (paths relative to the YAML file;
      a dataset without configs may map ``dataset id -> split -> file`` or use config ``default``), or
    * a directory laid out ``<mirror>/<dataset id>/<config>/<split>.<ext>``; a file also matches
      when its name is ``<prefix>.<split>.<ext>`` (e.g. ``wiki.test.raw``), and ``validation``
      also matches ``valid`` / ``val`` / ``dev``.

    Requested splits the mirror lacks are logged as a warning and left out of the result;
    when none is present, or the dataset/config is not in the mirror, a BertraceError says so.
    """
    mirror_path = repo_path(mirror)
    splits = list(splits)
    if not mirror_path.exists():
        raise BertraceError(
            f"hub mirror {mirror_path}: not found; point download.mirror / finetune.mirror / BERTRACE_HUB_MIRROR at a "
            "YAML index or a directory of local dataset copies, or unset it to use the hub"
        )
    if mirror_path.is_dir():
        found, where, available = _mirror_dir(mirror_path, dataset, config, splits)
    else:
        found, where, available = _mirror_index(mirror_path, dataset, config, splits)
    missing = [s for s in splits if s not in found]
    if not found:
        raise BertraceError(
            f"hub mirror {where}: none of the requested splits {splits} of {dataset}"
            f"{'/' + config if config else ''} is present (it has: {available or 'nothing'}); "
            "add them to the mirror or change download.hub.splits"
        )
    if missing:
        log.warning(
            "hub mirror %s: splits %s of %s%s are missing; continuing with %s",
            where,
            missing,
            dataset,
            "/" + config if config else "",
            list(found),
        )
    return found


def repo_path(path: str | os.PathLike, workspace: str | os.PathLike | None = None) -> Path:
    """``path`` (relative to the stage's working directory) as the user meant it.

    DVC sets ``DVC_ROOT`` to the repository it was started in; in a temporary experiment
    workspace (``dvc exp run --temp`` / ``--queue``: a copy of the repository's tracked files under
    ``<repo>/.dvc/tmp/exps/``) that differs from the working directory. A relative path that stays
    inside the workspace is the workspace's own (its copy of ``mirrors/…``); one that leaves it (``../``,
    a sibling of the repository such as ``../shared/data``) is taken relative to the original
    repository, as in a plain ``dvc repro``. Absolute paths and runs outside such a workspace: as given."""
    path = Path(os.path.expanduser(str(path)))
    root = os.environ.get("DVC_ROOT")
    if path.is_absolute() or not root:
        return path
    here = Path(os.path.abspath(workspace or os.getcwd()))
    origin = Path(os.path.abspath(root))
    if here == origin:
        return path
    absolute = os.path.normpath(here / path)
    if absolute == str(here) or absolute.startswith(str(here) + os.sep):
        return path  # inside the workspace copy
    return Path(os.path.normpath(origin / os.path.relpath(absolute, here)))


def _mirror_file(base: Path, rel: str) -> Path:
    """A mirror entry: relative to the YAML file's folder ``base``, through :func:`repo_path`."""
    rel = os.path.expanduser(rel)
    return Path(os.path.normpath(rel)) if os.path.isabs(rel) else repo_path(os.path.normpath(base / rel))


def _mirror_index(index: Path, dataset: str, config: str | None, splits: list[str]):
    try:
        entries = yaml.safe_load(index.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise BertraceError(
            f"hub mirror {index}: not a valid YAML index ({e}); it should map 'dataset id: {{config: {{split: path}}}}'"
        ) from None
    if not isinstance(entries, dict):
        raise BertraceError(f"hub mirror {index}: expected a mapping 'dataset id: {{config: {{split: path}}}}'")
    if dataset not in entries:
        raise BertraceError(
            f"hub mirror {index}: has no entry for dataset {dataset!r} (it has: {sorted(entries)}); "
            f"add '{dataset}: {{{config or 'default'}: {{split: path}}}}' or unset the mirror"
        )
    configs = entries[dataset] or {}
    if not isinstance(configs, dict):
        raise BertraceError(f"hub mirror {index}: entry {dataset!r} must map configs to splits")
    if config in configs:
        split_map = configs[config]
    elif config is None and "default" in configs:
        split_map = configs["default"]
    elif config is None and all(isinstance(v, str) for v in configs.values()):
        split_map = configs
    else:
        raise BertraceError(
            f"hub mirror {index}: dataset {dataset!r} has no config {config!r} "
            f"(it has: {sorted(map(str, configs))}); add it or change download.hub.config"
        )
    if not isinstance(split_map, dict):
        raise BertraceError(f"hub mirror {index}: {dataset}/{config} must map splits to file paths")
    found: dict[str, Path] = {}
    for split in splits:
        if split in split_map and split_map[split]:
            path = _mirror_file(index.parent, str(split_map[split]))
            if not path.is_file():
                raise BertraceError(
                    f"hub mirror {index}: {dataset}/{config}/{split} points at {path}, which does "
                    "not exist; fix the path (relative to the YAML file) or remove the entry"
                )
            found[split] = path
    return found, index, sorted(map(str, split_map))


def _mirror_dir(root: Path, dataset: str, config: str | None, splits: list[str]):
    base = root / dataset
    candidates = [base / config] if config else [base / "default", base]
    folder = next((c for c in candidates if c.is_dir()), None)
    if folder is None:
        raise BertraceError(
            f"hub mirror {root}: no folder {candidates[0]} for {dataset}"
            f"{'/' + config if config else ''}; lay it out as <mirror>/<dataset id>/<config>/<split>.<ext>"
        )
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    found: dict[str, Path] = {}
    for split in splits:
        names = SPLIT_ALIASES.get(split, (split,))
        matches = []
        for name in names:
            for p in files:
                stem, _, ext = p.name.rpartition(".")
                if ext in MIRROR_SUFFIXES and (stem == name or stem.endswith("." + name)):
                    matches.append(p)
            if matches:
                break
        if len(matches) > 1:
            raise BertraceError(
                f"hub mirror {folder}: several files match split {split!r}: {[m.name for m in matches]}; keep one"
            )
        if matches:
            found[split] = matches[0]
    return found, folder, [p.name for p in files]


def resolve_mirror_entries(
    mirror: str | os.PathLike, dataset: str, config: str | None, splits: list[str]
) -> dict[str, tuple[Path, dict[str, str]]]:
    """``{split: (file, column renames)}`` for the hub splits in a mirror.

    Entries written ``{path: ..., columns: {old: new}}`` are resolved here (relative to the
    YAML file); plain paths and mirror directories go through :func:`resolve_mirror`.
    """

    mirror_path = repo_path(mirror)
    entries = _mirror_yaml_entries(mirror_path, dataset, config) if mirror_path.is_file() else {}
    found: dict[str, tuple[Path, dict[str, str]]] = {}
    plain = []
    for split in splits:
        value = entries.get(split)
        if isinstance(value, dict):
            rel, columns = entry(value, f"hub mirror {mirror_path}: {dataset}/{config}/{split}")
            path = _mirror_file(mirror_path.parent, rel)
            if not path.is_file():
                raise BertraceError(
                    f"hub mirror {mirror_path}: {dataset}/{config}/{split} points at {path}, which "
                    "does not exist; fix the path (relative to the YAML file) or remove the entry"
                )
            found[split] = (path, columns)
        else:
            plain.append(split)
    if plain:
        for split, path in resolve_mirror(mirror_path, dataset, config, plain).items():
            found[split] = (path, {})
    missing = [s for s in splits if s not in found]
    if missing:
        raise BertraceError(
            f"hub mirror {mirror_path}: {dataset}/{config} has no split(s) {missing}; add them to the "
            "mirror or change finetune.task.splits"
        )
    return found


def entry(value: Any, where: str) -> tuple[str, dict[str, str]]:
    """A split entry: ``path`` or ``{path: ..., columns: {old: new}}``."""
    if isinstance(value, dict):
        if not value.get("path"):
            raise BertraceError(f"{where}: entry {value!r} has no 'path'; write {{path: file, columns: {{old: new}}}}")
        columns = value.get("columns") or {}
        if not isinstance(columns, dict):
            raise BertraceError(f"{where}: 'columns' must map old column names to new ones, got {columns!r}")
        return str(value["path"]), {str(k): str(v) for k, v in columns.items()}
    if not value:
        raise BertraceError(f"{where}: empty entry; give a file path")
    return str(value), {}


def _mirror_yaml_entries(index: Path, dataset: str, config: str | None) -> dict[str, Any]:
    """The split entries of ``dataset``/``config`` in a YAML mirror index ({} if not found;
    :func:`resolve_mirror` then reports what is missing)."""
    try:
        entries = yaml.safe_load(index.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError):
        return {}
    configs = entries.get(dataset) if isinstance(entries, dict) else None
    if not isinstance(configs, dict):
        return {}
    if config in configs:
        split_map = configs[config]
    elif config is None and "default" in configs:
        split_map = configs["default"]
    elif config is None:
        split_map = configs
    else:
        return {}
    return split_map if isinstance(split_map, dict) else {}
