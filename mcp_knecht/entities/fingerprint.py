"""Row fingerprints: what an update or delete was proposed against, checked again at execution.

A fingerprint is an HMAC over every column of the row (or over "absent"), keyed with a server
secret. Keyed, because it sits in the proposal's arguments, which the proposer can read: a plain
hash would let them test guesses of columns they may not read, or tell a missing row from one they
cannot see. The key is `KNECHT_ENTITIES_KEY`, else a file `entities-key` in the data dir (made at
first start, mode 0600); every process that executes proposals (servers, `knecht-approve`) must
share it — replicas on several hosts set the variable.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mcp_knecht.config import default_data_dir
from mcp_knecht.entities.sql import json_value
from mcp_knecht.errors import ConfigError

KEY_ENV = "KNECHT_ENTITIES_KEY"
KEY_FILENAME = "entities-key"
MIN_KEY_BYTES = 32


def load_key(env: Mapping[str, str]) -> bytes:
    if explicit := env.get(KEY_ENV):
        if len(explicit.encode()) < MIN_KEY_BYTES:
            raise ConfigError(f"{KEY_ENV} must be at least {MIN_KEY_BYTES} bytes long.")
        return explicit.encode()
    path = default_data_dir(env) / KEY_FILENAME
    if not path.exists():
        _create(path)
    mode = stat.S_IMODE(path.stat().st_mode)
    if os.name == "posix" and mode & 0o077:
        raise ConfigError(f"The entities key {path} is readable by others (mode {mode:o}); run: chmod 600 {path}")
    key = path.read_text(encoding="ascii").strip().encode()
    if len(key) < MIN_KEY_BYTES:
        raise ConfigError(f"The entities key in {path} is too short; delete the file to have a new one made.")
    return key


def _create(path: Path) -> None:
    """Appear complete or not at all; a concurrent first start keeps the other process's key."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(secrets.token_urlsafe(48) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)


def fingerprint(key: bytes, entity: str, row_id: Any, row: Mapping[str, Any] | None) -> str:
    """Differs per row id, so two missing rows do not share one recognisable "absent" value."""
    state: Any = None if row is None else {name: json_value(value) for name, value in row.items()}
    message = json.dumps([entity, json_value(row_id), state], sort_keys=True, separators=(",", ":"),
                         ensure_ascii=False, default=str)
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()
