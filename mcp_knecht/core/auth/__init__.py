"""Tokens: key configuration, verification into an `Actor`, and minting."""

from mcp_knecht.core.auth.keys import (
    ASYMMETRIC_ALGORITHMS,
    DEV_SECRET_FILENAME,
    MIN_SECRET_BYTES,
    TokenSettings,
    algorithms_for_key,
    load_public_key,
    load_token_settings,
)
from mcp_knecht.core.auth.minting import TOKEN_TTL, mint_token, parse_ttl
from mcp_knecht.core.auth.verifier import TokenVerifier, actor_from_claims

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
