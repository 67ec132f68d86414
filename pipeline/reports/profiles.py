"""Profiles: named sets of params overrides (``profiles/<name>.yaml``) on top of params.yaml.

A profile is a YAML mapping shaped like params.yaml holding only what differs, e.g. the
in-domain profile changes the corpus source and nothing else. ``flatten_overrides`` turns it
into dotted keys, checked against params.yaml so a typo fails with the key's name instead of
silently adding a param no stage reads; ``apply_overrides`` gives the merged params (tests,
smoke runs) and ``dvc_set_args`` the ``dvc exp run -S key=value`` arguments (``make repro
PROFILE=name``), so a profile run is an ordinary DVC experiment with its params diff on record.
"""

from __future__ import annotations

import copy
import shlex
from pathlib import Path
from typing import Any

import yaml

from pipeline.core.errors import BertraceError

PROFILES_DIR = Path("profiles")
# Mappings a profile may fill with new keys (model overrides, task file maps, baselines).
OPEN_SECTIONS = ("pretrain.model", "finetune.task.local", "finetune.task.columns", "evaluate.baselines")


def profile_path(name: str, directory: str | Path = PROFILES_DIR) -> Path:
    path = Path(name) if str(name).endswith((".yaml", ".yml")) else Path(directory) / f"{name}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in Path(directory).glob("*.yaml")) if Path(directory).is_dir() else []
        raise BertraceError(f"{path}: no such profile; known profiles: {known or 'none'} (in {directory}/)")
    return path


def load_profile(name: str, directory: str | Path = PROFILES_DIR) -> dict[str, Any]:
    path = profile_path(name, directory)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise BertraceError(f"{path}: not valid YAML ({e}); fix the file") from None
    if not isinstance(data, dict):
        raise BertraceError(f"{path}: a profile is a mapping shaped like params.yaml (section: {{key: value}})")
    data.pop("description", None)
    return data


def flatten_overrides(profile: dict[str, Any], params: dict[str, Any], source: str = "profile") -> dict[str, Any]:
    """``{"a.b.c": value}`` for every leaf of ``profile``; each key must exist in ``params``
    unless it lies under one of :data:`OPEN_SECTIONS`."""
    flat: dict[str, Any] = {}

    def walk(node: Any, base: Any, prefix: str) -> None:
        for key, value in node.items():
            dotted = f"{prefix}{key}"
            open_section = any(dotted.startswith(s + ".") or dotted == s for s in OPEN_SECTIONS)
            if not open_section and (not isinstance(base, dict) or key not in base):
                raise BertraceError(
                    f"{source}: {dotted} is not a key of params.yaml; fix the name "
                    "(profiles may only change existing params)"
                )
            sub = base.get(key) if isinstance(base, dict) else None
            if isinstance(value, dict) and value and (isinstance(sub, dict) or open_section):
                walk(value, sub if isinstance(sub, dict) else {}, dotted + ".")
            else:
                flat[dotted] = value

    walk(profile, params, "")
    return flat


def apply_overrides(params: dict[str, Any], flat: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(params)
    for dotted, value in flat.items():
        node = merged
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = copy.deepcopy(value)
    return merged


def _has_key(params: dict[str, Any], dotted: str) -> bool:
    node: Any = params
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


def dvc_set_args(flat: dict[str, Any], params: dict[str, Any] | None = None) -> list[str]:
    """``["-S", "a.b=value", ...]`` with values as YAML flow text (lists stay lists). Keys that
    ``params`` lacks (new keys in an open section) get Hydra's ``+`` prefix, which DVC needs to add them."""
    args = []
    for dotted, value in flat.items():
        text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
        if text.endswith("\n...") or text.endswith("..."):
            text = text.rsplit("\n", 1)[0].strip()
        plus = "+" if params is not None and not _has_key(params, dotted) else ""
        args += ["-S", f"{plus}{dotted}={text}"]
    return args


def shell_args(flat: dict[str, Any], params: dict[str, Any] | None = None) -> str:
    return " ".join(shlex.quote(a) for a in dvc_set_args(flat, params))
