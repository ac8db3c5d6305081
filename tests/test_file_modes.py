"""Issue 11, item 9: every database, secret and key file the project creates is private to its
user — whichever command creates it first."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, server_env

pytestmark = pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mcp_knecht.cli.main", *args], env=server_env(env),
                          capture_output=True, text=True, timeout=300, check=False)


def test_demo_data_writes_a_private_database_in_a_private_folder(tmp_path: Path) -> None:
    folder = tmp_path / "fresh" / "data"
    env = {"KNECHT_CONFIG_DIR": str(REPO), "KNECHT_DATA_DIR": str(folder), "KNECHT_JWT_SECRET": "x" * 48}
    done = _run(env, "demo-data", "--runs", "20")  # the default database: <data dir>/knecht.db
    assert done.returncode == 0, done.stderr
    database = folder / "knecht.db"
    assert _mode(folder) == 0o700
    assert _mode(database) == 0o600
    for companion in (folder / "knecht.db-wal", folder / "knecht.db-shm"):
        if companion.exists():
            assert _mode(companion) == 0o600, companion.name


def test_a_database_elsewhere_and_the_generated_secrets_are_private(tmp_path: Path) -> None:
    env = {"KNECHT_CONFIG_DIR": str(REPO), "KNECHT_DATA_DIR": str(tmp_path / "data"),
           "KNECHT_DATABASE_URL": f"sqlite:///{tmp_path / 'db' / 'k.db'}"}
    minted = _run(env, "token", "mint", "--sub", "alice", "--scope", "runs:read")  # generates the dev secret
    assert minted.returncode == 0, minted.stderr
    checked = _run(env, "audit", "verify")  # opens (so creates) the database
    assert checked.returncode == 0, checked.stderr
    assert _mode(tmp_path / "db") == 0o700 and _mode(tmp_path / "db" / "k.db") == 0o600
    assert _mode(tmp_path / "data") == 0o700 and _mode(tmp_path / "data" / "jwt-secret") == 0o600
