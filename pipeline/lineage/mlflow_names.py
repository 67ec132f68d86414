"""MLflow names: how params, tags and metrics are keyed and cut to MLflow's limits.

MLflow accepts param, tag and metric keys of at most 250 characters made of
alphanumerics, ``_ - . / space`` (and ``:`` except on Windows) that do not resolve to another
path (no ``//``, ``./``, leading ``/``). User strings reach those names: corpus file names
(``bertrace.input.<file>``), column renames and split names (params), label names (per-class
metrics). :func:`mlflow_name` is the one function every such key goes through: a key that is
valid ASCII stays as it is; any other becomes a valid ASCII key (accents dropped, other
characters ``_``) followed by ``-`` and 10 hex digits of the sha256 of the original, so it is
stable (same input, same name, on every machine and version), collision-free (two originals
never share a name) and never longer than the limit. The stage keeps the originals of renamed
keys in the run's ``names.json`` artifact (mapped name → original).
"""

from __future__ import annotations

import hashlib
import posixpath
import re
import unicodedata
from typing import Any

MAX_PARAM_CHARS = 6000  # MLflow's limit on one param value
MAX_TAG_CHARS = 5000  # MLflow's limit on one tag value (8000 in MLflow 3, 5000 before)
MAX_KEY_CHARS = 250  # MLflow's limit on a param, tag or metric key
HASH_CHARS = 10  # hex digits of the original's sha256 appended to a renamed key
_VALID = re.compile(r"[A-Za-z0-9_.\- /]*")  # portable: MLflow's set without ':' (refused on Windows)
_INVALID_RUN = re.compile(r"[^A-Za-z0-9_.\- /]+")  # a run of other characters becomes one "_"
_NOT_ASCII = "\x00"  # stands for a character with no ASCII form, until _INVALID_RUN replaces it


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """``{"model": {"preset": "mini"}}`` → ``{"model.preset": "mini"}`` (lists stay values)."""
    flat: dict[str, Any] = {}
    if isinstance(obj, dict):
        for key, value in obj.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            flat.update(flatten(value, name))
    else:
        flat[prefix] = obj
    return flat


def is_valid_name(name: str, max_chars: int = MAX_KEY_CHARS) -> bool:
    """Whether MLflow takes ``name`` as a key as it is, on every platform and store."""
    if not name or len(name) > max_chars or not _VALID.fullmatch(name):
        return False
    norm = posixpath.normpath(name)
    return norm == name and norm != "." and not norm.startswith("..") and not norm.startswith("/")


def mlflow_name(name: Any, max_chars: int = MAX_KEY_CHARS) -> str:
    """``name`` as a valid MLflow key: unchanged when valid, else a stable, collision-free rename
    (see the module docstring), e.g. ``"Stars (1-5)"`` → ``"Stars _1-5_-<10 hex>"``."""
    name = str(name)
    if is_valid_name(name, max_chars):
        return name
    suffix = "-" + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_CHARS]
    readable = _path_segments(_INVALID_RUN.sub("_", _ascii(name)))
    readable = _path_segments(readable[: max(0, max_chars - len(suffix))]) or "_"
    out = readable + suffix
    assert is_valid_name(out, max_chars), (name, out)
    return out


def _ascii(text: str) -> str:
    """Latin letters without their accents (``é`` → ``e``); other characters as they are."""
    out = []
    for ch in text:
        if ch.isascii():
            out.append(ch)
            continue
        base = unicodedata.normalize("NFKD", ch).encode("ascii", "ignore").decode("ascii")
        out.append(base if base and base.isalnum() else _NOT_ASCII)
    return "".join(out)


def _path_segments(text: str) -> str:
    """``text`` with no empty, ``.`` or ``..`` path segment and no leading or trailing ``/``."""
    parts = []
    for part in text.split("/"):
        if part in ("", ".", ".."):
            part = "_" * len(part) if part else ""
        if part:
            parts.append(part)
    return "/".join(parts)


def mlflow_params(params: dict[str, Any], renamed: dict[str, str] | None = None) -> dict[str, str]:
    """Flattened params as MLflow params: keys through :func:`mlflow_name`, values as text cut
    to MLflow's limit. ``renamed`` (if given) collects ``{mapped: original}`` of renamed keys."""
    return {_key(k, renamed): _cut(str(v), MAX_PARAM_CHARS) for k, v in flatten(params).items()}


def mlflow_tags(tags: dict[str, Any], renamed: dict[str, str] | None = None) -> dict[str, str]:
    """Tags with valid keys and values cut to MLflow's limit (the original names in ``renamed``)."""
    return {_key(k, renamed): _cut(str(v), MAX_TAG_CHARS) for k, v in tags.items()}


def mlflow_metrics(metrics: dict[str, Any], renamed: dict[str, str] | None = None) -> dict[str, float]:
    """The numbers of a (nested) metrics dict, flattened, with valid keys; booleans, text and
    None are left out."""
    out = {}
    for k, v in flatten(metrics).items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[_key(k, renamed)] = float(v)
    return out


def mlflow_artifact_path(path: str | None) -> str | None:
    """An artifact folder (``evaluation``, ``provenance`` ...) as a safe relative path."""
    return None if path in (None, "") else mlflow_name(path)


def _key(key: Any, renamed: dict[str, str] | None) -> str:
    name = mlflow_name(key)
    if renamed is not None and name != str(key):
        renamed[name] = str(key)
    return name


def _cut(value: str, limit: int) -> str:
    return value if len(value) <= limit else value[: limit - 1] + "…"
