"""Secrets the server generates for itself (the dev signing secret, the entities key): files
only the owner may read, created so that they appear complete or not at all."""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from mcp_knecht.errors import ConfigError


def create_secret_file(path: Path) -> bool:
    """Write a fresh random secret with mode 0600; False if another process made it first."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(secrets.token_urlsafe(48) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        # link() refuses to replace: a concurrent first start keeps the other process's secret.
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


def read_secret_file(path: Path, *, what: str, min_bytes: int) -> str:
    """The secret in `path`, refused when others may read the file or when it is too short."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if os.name == "posix" and mode & 0o077:
        raise ConfigError(f"The {what} {path} is readable by others (mode {mode:o}); run: chmod 600 {path}")
    secret = path.read_text(encoding="utf-8").strip()
    if len(secret.encode()) < min_bytes:
        raise ConfigError(
            f"The {what} in {path} is shorter than {min_bytes} bytes; delete the file to have a new one made."
        )
    return secret
