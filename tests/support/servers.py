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
