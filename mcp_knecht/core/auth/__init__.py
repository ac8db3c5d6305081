"""Tokens: key configuration, verification into an `Actor`, and minting.

The key settings (`keys`) load with this package; the verifier and minting — pyjwt, and with it
`cryptography` — with the first use of one of their names, so a stdio server whose key is a secret
can load pyjwt without `cryptography` (`hmac_only`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mcp_knecht.core.auth.keys import (
    ASYMMETRIC_ALGORITHMS,
    DEV_SECRET_FILENAME,
    MIN_SECRET_BYTES,
    TokenSettings,
    algorithms_for_key,
    load_public_key,
    load_token_settings,
)

if TYPE_CHECKING:
    from mcp_knecht.core.auth.minting import TOKEN_TTL, mint_token, parse_ttl
    from mcp_knecht.core.auth.verifier import TokenVerifier, actor_from_claims

_LOADED_ON_USE = {"TOKEN_TTL": "minting", "mint_token": "minting", "parse_ttl": "minting",
                  "TokenVerifier": "verifier", "actor_from_claims": "verifier"}


def __getattr__(name: str) -> Any:
    module = _LOADED_ON_USE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = [
    "ASYMMETRIC_ALGORITHMS",
    "DEV_SECRET_FILENAME",
    "MIN_SECRET_BYTES",
    "TOKEN_TTL",
    "TokenSettings",
    "TokenVerifier",
    "actor_from_claims",
    "algorithms_for_key",
    "load_public_key",
    "load_token_settings",
    "mint_token",
    "parse_ttl",
]
