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
from collections.abc import Mapping
from typing import Any

from mcp_knecht.core.secret_file import create_secret_file, read_secret_file
from mcp_knecht.core.settings import ENTITIES_KEY, Settings
from mcp_knecht.entities.sql import json_value
from mcp_knecht.errors import ConfigError

KEY_FILENAME = "entities-key"
MIN_KEY_BYTES = 32


def load_key(settings: Settings) -> bytes:
    if explicit := settings.entities_key:
        if len(explicit.encode()) < MIN_KEY_BYTES:
            raise ConfigError(f"{ENTITIES_KEY.name} must be at least {MIN_KEY_BYTES} bytes long.")
        return explicit.encode()
    path = settings.data_dir / KEY_FILENAME
    if not path.exists():
        create_secret_file(path)
    return read_secret_file(path, what="entities key", min_bytes=MIN_KEY_BYTES).encode()


def fingerprint(key: bytes, entity: str, row_id: Any, row: Mapping[str, Any] | None) -> str:
    """Differs per row id, so two missing rows do not share one recognisable "absent" value."""
    state: Any = None if row is None else {name: json_value(value) for name, value in row.items()}
    message = json.dumps([entity, json_value(row_id), state], sort_keys=True, separators=(",", ":"),
                         ensure_ascii=False, default=str)
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()
