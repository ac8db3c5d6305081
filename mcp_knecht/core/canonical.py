"""Canonical JSON: one byte sequence per value, so a hash identifies exactly one call."""

from __future__ import annotations

import hashlib
import json
from typing import Any

# Built once: `json.dumps` with options builds an encoder per call, which costs as much as the encoding.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical_json(value: Any) -> str:
    return _CANONICAL.encode(value)


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
