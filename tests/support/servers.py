"""The team's real servers for tests: SeaweedFS (S3), PostgreSQL, MLflow (scripts/team.py).

``team_servers(state_dir)`` starts them on free 127.0.0.1 ports, yields scripts/team.py's info dict
(``urls``, ``env``, ``pids``, ``credentials``) and stops them by PID afterwards. A test skips,
saying what to install, when the ``weed`` binary, boto3/psycopg2 or PostgreSQL's binaries are
missing (``.ci/run`` installs all three).
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO


def _team_module():
    """scripts/team.py as a module (scripts/ is no package), loaded once per process."""
    name = "bertrace_team_script"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / "team.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


team = _team_module()


def require_team_binaries() -> None:
    """Skip (naming the install step) when the servers cannot be started on this machine."""
    for module in ("boto3", "psycopg2", "dvc_s3"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"no {module}: pip install -e '.[team]'")
    try:
        team.find_weed()
        team.find_pg_bindir()
    except team.TeamError as e:
        pytest.skip(str(e))


@contextlib.contextmanager
def team_servers(state_dir: Path) -> Iterator[dict]:
    require_team_binaries()
    info = team.start_servers(state_dir)
    try:
        yield info
    finally:
        team.stop_servers(state_dir)


ADMIN = ("admin", "s3cret-Passw0rd")  # the basic-auth server's account


@contextlib.contextmanager
def basic_auth_mlflow(tmp_path: Path) -> Iterator[str]:
    """A real ``mlflow server --app-name basic-auth`` on a free 127.0.0.1 port with one account
    (:data:`ADMIN`); yields its URI (no credentials in it) and stops it by PID afterwards."""
    import os
    import signal
    import socket
    import subprocess
    import time
    import urllib.request

    if importlib.util.find_spec("flask_wtf") is None:
        pytest.skip("no Flask-WTF: pip install -e '.[team]'")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "basic_auth.ini").write_text(
        "[mlflow]\ndefault_permission = READ\n"
        f"database_uri = sqlite:///{tmp_path}/auth.db\nadmin_username = {ADMIN[0]}\nadmin_password = {ADMIN[1]}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
    )
    env = {
        **os.environ,
        "MLFLOW_AUTH_CONFIG_PATH": str(tmp_path / "basic_auth.ini"),
        "MLFLOW_FLASK_SERVER_SECRET_KEY": os.urandom(16).hex(),
    }
    for k in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        env.pop(k, None)
    cmd = [sys.executable, "-m", "mlflow", "server", "--app-name", "basic-auth", "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--workers", "1", "--backend-store-uri", f"sqlite:///{tmp_path}/mlflow.db"]
    with open(tmp_path / "server.log", "wb") as log:
        server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(uri + "/health", timeout=2)
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "server.log").read_text()
                time.sleep(0.5)
        yield uri
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
