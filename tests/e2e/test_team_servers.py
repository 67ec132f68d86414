"""The team servers themselves (scripts/team.py, docs/team.md): real SeaweedFS S3, a real
PostgreSQL-backed MLflow server with artifacts proxied to S3, stopped by PID."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO
from tests.support.servers import ADMIN, basic_auth_mlflow, team, team_servers

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    state = tmp_path_factory.mktemp("team") / "state"
    with team_servers(state) as info:
        yield state, info


def _s3(info, secret=None):
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=info["urls"]["s3"],
        region_name="us-east-1",
        aws_access_key_id=info["credentials"]["access_key"],
        aws_secret_access_key=secret or info["credentials"]["secret_key"],
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )


def test_s3_put_get_list_and_wrong_key_refused(servers):
    from botocore.exceptions import ClientError

    state, info = servers
    s3 = _s3(info)
    assert {"dvc", "mlflow"} <= {b["Name"] for b in s3.list_buckets()["Buckets"]}
    body = os.urandom(100_000)
    s3.put_object(Bucket="dvc", Key="t/blob", Body=body)
    assert s3.get_object(Bucket="dvc", Key="t/blob")["Body"].read() == body
    assert [o["Key"] for o in s3.list_objects_v2(Bucket="dvc", Prefix="t/")["Contents"]] == ["t/blob"]
    with pytest.raises(ClientError) as e:
        _s3(info, secret="0" * 40).get_object(Bucket="dvc", Key="t/blob")
    assert e.value.response["Error"]["Code"] in ("SignatureDoesNotMatch", "AccessDenied", "InvalidAccessKeyId")


def test_secrets_are_private_and_env_names_the_servers(servers):
    state, info = servers
    assert stat.S_IMODE((state / "credentials").stat().st_mode) == 0o600
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    env = info["env"]
    assert set(env) == {"MLFLOW_TRACKING_URI", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"}
    assert env["MLFLOW_TRACKING_URI"].startswith("http://127.0.0.1:")
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts/team.py"), "env", "--state", str(state)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out == "".join(f"export {k}={v}\n" for k, v in env.items())
    # the servers' command lines (visible to every local user in ps) hold no secret
    for pid in info["pids"].values():
        cmdline = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
        assert info["credentials"]["secret_key"] not in cmdline
        assert info["credentials"]["pg_password"] not in cmdline


def test_mlflow_runs_in_postgres_and_artifacts_in_s3(servers, tmp_path):
    state, info = servers
    code = f"""
import mlflow, pathlib
mlflow.set_tracking_uri({info["urls"]["mlflow"]!r})
mlflow.set_experiment("team-servers")
with mlflow.start_run() as run:
    mlflow.log_param("p", 1)
    mlflow.log_metric("m", 0.5)
    f = pathlib.Path({str(tmp_path)!r}) / "note.txt"
    f.write_text("hello from a client")
    mlflow.log_artifact(str(f))
print(run.info.run_id, run.info.experiment_id)
"""
    # the client has no S3 credentials: the server proxies artifact uploads (--artifacts-destination)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "MLFLOW_TRACKING_URI"}
    run_id, exp_id = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split()[-2:]
    import psycopg2

    with (
        psycopg2.connect(
            host="127.0.0.1",
            port=info["ports"]["postgres"],
            user="mlflow",
            dbname="mlflow",
            password=info["credentials"]["pg_password"],
        ) as conn,
        conn.cursor() as cur,
    ):
        cur.execute("SELECT key, value FROM params WHERE run_uuid = %s", (run_id,))
        assert cur.fetchall() == [("p", "1")]
        cur.execute("SELECT value FROM metrics WHERE run_uuid = %s AND key = 'm'", (run_id,))
        assert cur.fetchall() == [(0.5,)]
    keys = [o["Key"] for o in _s3(info).list_objects_v2(Bucket="mlflow", Prefix=f"{exp_id}/{run_id}/")["Contents"]]
    assert keys == [f"{exp_id}/{run_id}/artifacts/note.txt"]
    obj = _s3(info).get_object(Bucket="mlflow", Key=keys[0])["Body"].read()
    assert obj == b"hello from a client"


def _team_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "scripts/team.py"), *args], capture_output=True, text=True)


def test_a_server_that_died_is_named_by_env_and_restarted_by_up(servers):
    """MLflow killed while S3 and PostgreSQL run: `env` warns about it alone, `up` starts it alone
    (same port, same store), not "already up"."""
    import signal
    import urllib.request

    state, info = servers
    pids = json.loads((state / "pids.json").read_text())
    os.killpg(pids["mlflow"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while "mlflow" in team.running(state) and time.monotonic() < deadline:  # a zombie counts as dead
        time.sleep(0.1)
    assert set(team.running(state)) == {"weed", "postgres"}
    r = _team_cli("env", "--state", str(state))
    assert r.returncode == 0 and r.stdout == "".join(f"export {k}={v}\n" for k, v in info["env"].items())
    assert r.stderr.splitlines() == [
        "warning: the team's MLflow server is down (the others run); `make team-up` restarts it"
    ]
    r = _team_cli("up", "--state", str(state))
    assert r.returncode == 0, r.stderr
    (line,) = r.stderr.splitlines()
    assert line.startswith("restarted MLflow in ") and line.endswith(
        f" s (was down; the others kept running; state, logs: {state})"
    ), line
    after = json.loads((state / "pids.json").read_text())
    assert {k: after[k] for k in ("weed", "postgres")} == {k: pids[k] for k in ("weed", "postgres")}
    assert after["mlflow"] != pids["mlflow"] and set(team.running(state)) == {"weed", "postgres", "mlflow"}
    with urllib.request.urlopen(f"{info['urls']['mlflow']}/health", timeout=10) as answer:
        assert answer.status == 200
    r = _team_cli("env", "--state", str(state))
    assert r.returncode == 0 and r.stderr == ""
    r = _team_cli("up", "--state", str(state))
    assert r.returncode == 0 and r.stderr.startswith("team servers already up")


def test_up_twice_is_refused_then_down_stops_every_pid(servers):
    """Last in this file: it stops the module's servers."""
    state, info = servers
    with pytest.raises(team.TeamError, match="already up"):
        team.start_servers(state)
    pids = json.loads((state / "pids.json").read_text())
    assert set(pids) == {"weed", "postgres", "mlflow"}
    r = subprocess.run(
        [sys.executable, str(REPO / "scripts/team.py"), "down", "--state", str(state)], capture_output=True, text=True
    )
    assert r.returncode == 0 and r.stderr.strip() == "stopped: mlflow, postgres, weed", r.stderr
    for name, pid in pids.items():
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z", name
    assert not (state / "pids.json").exists()
    # the CLI: one line, exit 2, when a port is taken
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = subprocess.run(
            [sys.executable, str(REPO / "scripts/team.py"), "up", "--state", str(state), "--s3-port", str(port)],
            capture_output=True,
            text=True,
        )
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        f"error: port {port} on 127.0.0.1 (for s3) is taken; pick another or stop what uses it"
    ]
    assert json.loads((state / "credentials").read_text())["secret_key"] == info["credentials"]["secret_key"]


def test_refused_credentials_are_one_line_naming_the_fix(tmp_path):
    """A tracking server with accounts (mlflow server --app-name basic-auth): no or wrong credentials
    are one line naming MLFLOW_TRACKING_URI and the variables to set, exit 2; right ones pass."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_")}
    env["PYTHONPATH"] = str(REPO)
    with basic_auth_mlflow(tmp_path) as uri:
        check = [sys.executable, "-m", "stages.cli", "check-tracking"]
        for creds in ({}, {"MLFLOW_TRACKING_USERNAME": ADMIN[0], "MLFLOW_TRACKING_PASSWORD": "wrong"}):
            r = subprocess.run(
                check, cwd=tmp_path, env={**env, "MLFLOW_TRACKING_URI": uri, **creds}, capture_output=True, text=True
            )
            assert r.returncode == 2, r.stdout + r.stderr
            assert r.stderr.strip() == (
                f"error: MLFLOW_TRACKING_URI={uri}: the server refused this client's "
                "credentials (HTTP 401); set MLFLOW_TRACKING_USERNAME and "
                "MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) to an account it knows"
            )
            assert "wrong" not in r.stderr
        ok = subprocess.run(
            check,
            cwd=tmp_path,
            env={
                **env,
                "MLFLOW_TRACKING_URI": uri,
                "MLFLOW_TRACKING_USERNAME": ADMIN[0],
                "MLFLOW_TRACKING_PASSWORD": ADMIN[1],
            },
            capture_output=True,
            text=True,
        )
        assert ok.returncode == 0 and ok.stdout.strip() == f"MLflow tracking store answers: {uri}", ok.stderr
