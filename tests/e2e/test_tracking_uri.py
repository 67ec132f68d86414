"""``MLFLOW_TRACKING_URI`` with credentials in it (``http://user:password@host:port``), as
MLflow's own client takes it: `check-tracking` (the first step of `make repro` and of every
stage) accepts a server that accepts them, names what is wrong in one line otherwise, and never
shows the password."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.support.servers import ADMIN, basic_auth_mlflow

pytestmark = pytest.mark.slow
CHECK = [sys.executable, "-m", "stages.cli", "check-tracking"]


def _check(cwd, uri: str):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_")}
    env.update(PYTHONPATH=str(REPO), MLFLOW_TRACKING_URI=uri)
    return subprocess.run(CHECK, cwd=cwd, env=env, capture_output=True, text=True)


def test_credentials_in_the_uri_reach_a_basic_auth_server(tmp_path):
    with basic_auth_mlflow(tmp_path) as uri:
        host = uri.removeprefix("http://")
        ok = _check(tmp_path, f"http://{ADMIN[0]}:{ADMIN[1]}@{host}")
        assert ok.returncode == 0, ok.stderr
        assert ok.stdout.strip() == f"MLflow tracking store answers: {uri}"
        wrong = _check(tmp_path, f"http://{ADMIN[0]}:wr0ng-Secret@{host}")
        assert wrong.returncode == 2, wrong.stdout + wrong.stderr
        assert wrong.stderr.strip() == (
            f"error: MLFLOW_TRACKING_URI={uri}: the server refused this client's credentials (HTTP 401); "
            "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) to an account it knows"
        )
        assert "wr0ng" not in wrong.stdout + wrong.stderr


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


def test_nothing_listening_is_connection_refused_not_dns(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = _check(tmp_path, f"http://user:Pa55-w0rd@127.0.0.1:{port}")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"error: MLFLOW_TRACKING_URI=http://127.0.0.1:{port}: no MLflow server answers (connection refused: "
        f"nothing listens on 127.0.0.1:{port}); start it (`make team-up` for a local trial), or unset "
        "MLFLOW_TRACKING_URI to log to ./mlflow.db, or set BERTRACE_NO_MLFLOW=1 to run without tracking"
    ]
    assert "Pa55" not in r.stdout + r.stderr
    if _has_ipv6_loopback():  # an IPv6 host keeps its brackets: [::1]:PORT, not ::1:PORT
        v6 = _check(tmp_path, f"http://[::1]:{port}")
        assert f"(connection refused: nothing listens on [::1]:{port})" in v6.stderr, v6.stderr
    dns = _check(tmp_path, "http://user:Pa55-w0rd@no-such-host.invalid:5000")
    assert dns.returncode == 2
    assert "(the host name 'no-such-host.invalid' does not resolve)" in dns.stderr, dns.stderr
    assert "Pa55" not in dns.stdout + dns.stderr
