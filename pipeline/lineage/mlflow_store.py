"""Where MLflow runs go: the tracking store, its URI (without credentials), and one request that
a tracking server answers before a stage writes anything.

Default store: a SQLite file ``mlflow.db`` in the working directory (the repo root when DVC
runs a stage; the original repository's root for ``dvc exp run --temp`` / ``--queue``, see
:func:`store_root`) with artifacts under ``mlartifacts/``; ``MLFLOW_TRACKING_URI`` overrides both
(any server or store MLflow supports). The experiment is ``bertrace`` unless
``MLFLOW_EXPERIMENT_NAME`` says otherwise.
"""

from __future__ import annotations

import logging
import os
import re
import socket
from pathlib import Path
from typing import Any

from pipeline.core.errors import BertraceError

DEFAULT_EXPERIMENT = "bertrace"


def store_root(root: str | os.PathLike = ".") -> Path:
    """Where the default store lives: ``root``, except that the working directory of a DVC
    experiment's temporary workspace (``dvc exp run --temp`` / ``--queue``: a copy under
    ``.dvc/tmp/exps/``, removed afterwards) stands for the repository DVC was started in
    (``DVC_ROOT``), so every run of every experiment lands in the repository's one store."""
    if str(root) == "." and os.environ.get("DVC_ROOT"):
        return Path(os.environ["DVC_ROOT"]).resolve()
    return Path(root).resolve()


def default_tracking_uri(root: str | os.PathLike = ".") -> str:
    return "sqlite:///" + str(store_root(root) / "mlflow.db")


def tracking_uri(root: str | os.PathLike = ".") -> str:
    """``MLFLOW_TRACKING_URI`` when set, else ``<root>/mlflow.db``."""
    return os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(root)


def redacted_uri(uri: str | None) -> str | None:
    """``uri`` without credentials: user info (``user:password@``) and password-like query
    parameters removed, for logs, records and error messages."""
    if not uri:
        return uri
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    parts = urlsplit(uri)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    query = urlencode(
        [
            (k, "***" if re.search(r"pass|secret|token|key", k, re.I) else v)
            for k, v in parse_qsl(parts.query, keep_blank_values=True)
        ]
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def check_server(uri: str, experiment: str = DEFAULT_EXPERIMENT, timeout: float = 10.0) -> None:
    """For an ``http(s)://`` tracking URI: one request that the server answers and accepts this
    client's credentials (``MLFLOW_TRACKING_USERNAME`` / ``_PASSWORD`` / ``_TOKEN``, or the
    ``user:password@`` of the URI, as MLflow's client takes them), so a stage fails in seconds,
    before it writes anything, instead of after MLflow's retries. Raises
    :class:`~pipeline.core.errors.BertraceError` naming ``MLFLOW_TRACKING_URI`` (without its
    password) and the fix."""
    import urllib.error
    import urllib.parse
    import urllib.request

    if not uri.startswith(("http://", "https://")):
        return
    shown = redacted_uri(uri)
    parts = urllib.parse.urlsplit(uri)
    url = (
        urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1])).rstrip("/")
        + "/api/2.0/mlflow/experiments/get-by-name?"
        + urllib.parse.urlencode({"experiment_name": experiment})
    )
    request = urllib.request.Request(url)
    auth = _authorization(parts)
    if auth:
        request.add_header("Authorization", auth)
    offline = (
        "; start it (`make team-up` for a local trial), or unset MLFLOW_TRACKING_URI to log to "
        "./mlflow.db, or set BERTRACE_NO_MLFLOW=1 to run without tracking"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout):
            return
    except urllib.error.HTTPError as e:
        if e.code == 404:  # no such experiment yet: the server answered
            return
        if e.code in (401, 403):
            raise BertraceError(
                f"MLFLOW_TRACKING_URI={shown}: the server refused this client's credentials "
                f"(HTTP {e.code}); set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD "
                "(or MLFLOW_TRACKING_TOKEN) to an account it knows"
            ) from None
        raise BertraceError(
            f"MLFLOW_TRACKING_URI={shown}: the tracking server answered HTTP {e.code} "
            f"({e.reason}); check its log and its database{offline}"
        ) from None
    except (urllib.error.URLError, OSError) as e:
        reason = _unreachable(parts, getattr(e, "reason", e), timeout)
        raise BertraceError(f"MLFLOW_TRACKING_URI={shown}: no MLflow server answers ({reason}){offline}") from None


def _authorization(parts) -> str | None:
    """The ``Authorization`` header MLflow's client would send: a token, else the username and
    password of the environment, else those of the URI's user info."""
    import base64
    from urllib.parse import unquote

    if os.environ.get("MLFLOW_TRACKING_TOKEN"):
        return f"Bearer {os.environ['MLFLOW_TRACKING_TOKEN']}"
    if os.environ.get("MLFLOW_TRACKING_USERNAME"):
        pair = f"{os.environ['MLFLOW_TRACKING_USERNAME']}:{os.environ.get('MLFLOW_TRACKING_PASSWORD', '')}"
    elif parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
    else:
        return None
    return "Basic " + base64.b64encode(pair.encode()).decode()


def _unreachable(parts, reason: Any, timeout: float) -> str:
    """Why nothing answered, in words that point at the fix: the host name, the port, the wait."""
    host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname  # IPv6 in brackets
    where = f"{host}:{parts.port or (443 if parts.scheme == 'https' else 80)}"
    if isinstance(reason, socket.gaierror):
        return f"the host name {parts.hostname!r} does not resolve"
    if isinstance(reason, ConnectionRefusedError):
        return f"connection refused: nothing listens on {where}"
    if isinstance(reason, TimeoutError | socket.timeout):
        return f"no answer from {where} within {timeout:g} s"
    text = str(reason)
    if parts.password:
        text = text.replace(parts.password, "***")
    return text


def setup_mlflow(root: str | os.PathLike = "."):
    """Point MLflow at the configured store and return the experiment id."""
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    import mlflow

    explicit = bool(os.environ.get("MLFLOW_TRACKING_URI"))  # read first: set_tracking_uri sets the variable
    uri = tracking_uri(root)
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME", DEFAULT_EXPERIMENT)
    check_server(uri, name)
    mlflow.set_tracking_uri(uri)
    try:
        experiment = mlflow.get_experiment_by_name(name)
    except Exception as e:  # noqa: BLE001 - a database URI that does not connect, a store that is not MLflow's
        detail = (str(e).strip().splitlines() or [""])[0][:160]
        from urllib.parse import urlsplit

        if urlsplit(uri).password:
            detail = detail.replace(urlsplit(uri).password, "***")
        raise BertraceError(
            f"MLFLOW_TRACKING_URI={redacted_uri(uri)}: the tracking store did not answer "
            f"({type(e).__name__}: {detail}); check that it "
            "is running and reachable, or unset MLFLOW_TRACKING_URI to log to ./mlflow.db"
        ) from None
    if experiment is not None:
        return experiment.experiment_id
    artifact_location = None
    if not explicit:
        artifact_location = (store_root(root) / "mlartifacts").as_uri()
    try:
        return mlflow.create_experiment(name, artifact_location=artifact_location)
    except Exception:  # created concurrently by another stage
        return mlflow.get_experiment_by_name(name).experiment_id
