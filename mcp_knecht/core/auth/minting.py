"""Mint tokens: HS256 with the shared secret, or with a private key the admin hands us."""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa

from mcp_knecht.core.auth.keys import TokenSettings, algorithms_for_key, load_public_key
from mcp_knecht.core.durations import parse_duration
from mcp_knecht.errors import ConfigError, UsageError

TOKEN_TTL = timedelta(hours=8)
"""The lifetime of a minted token unless `--ttl` says otherwise."""
MAX_TTL = timedelta(days=365)

PrivateKey = (
    rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey | ed448.Ed448PrivateKey
)


def mint_token(
    settings: TokenSettings,
    *,
    subject: str,
    scopes: Iterable[str],
    client: str = "cli",
    ttl: timedelta = TOKEN_TTL,
    private_key_pem: bytes | None = None,
    key_id: str | None = None,
    now: datetime | None = None,
    extra_claims: Mapping[str, Any] | None = None,
) -> str:
    """Return a signed JWT that this server's `TokenVerifier` accepts.

    `extra_claims` adds application claims (e.g. `knecht_role` for the entities toolset); the
    registered ones this function sets (iss, aud, sub, exp, scope, …) cannot be overridden.

    `now` exists for tests and for minting tokens that start later.
    """
    if not isinstance(subject, str) or not subject.strip():
        raise UsageError("A token needs a subject (--sub NAME).")
    if ttl <= timedelta(0) or ttl > MAX_TTL:
        raise UsageError(f"Token lifetime must be positive and at most {MAX_TTL.days} days.")
    scope_list = sorted(set(scopes))
    for scope in scope_list:
        if not isinstance(scope, str) or not scope or any(ch.isspace() for ch in scope):
            raise UsageError(f"Invalid scope name {scope!r}: scopes are single words like 'projects:read'.")

    issued = (now or datetime.now(UTC)).replace(microsecond=0)
    claims: dict[str, Any] = {
        "iss": settings.issuer,
        "aud": settings.audience,
        "sub": subject,
        "iat": issued,
        "nbf": issued,
        "exp": issued + ttl,
        "jti": secrets.token_urlsafe(16),
        "scope": " ".join(scope_list),
        "client_id": client,
    }
    if extra_claims:
        if clash := sorted(set(extra_claims) & (set(claims) | {"scp", "azp"})):
            raise UsageError(f"Claim {clash[0]!r} is set by mcp-knecht itself and cannot be given as --claim.")
        claims.update(extra_claims)
    headers = {"kid": key_id} if key_id else None
    if settings.secret is not None:
        return jwt.encode(claims, settings.secret, algorithm="HS256", headers=headers)
    if private_key_pem is None:
        raise ConfigError("Minting needs the private key; tokens come from your identity provider.")
    private_key = _load_private_key(private_key_pem)
    public_key = private_key.public_key()
    if settings.public_key_path is not None and not _same_key(public_key, settings.public_key_path):
        raise ConfigError(
            f"The private key does not match the public key {settings.public_key_path}; "
            "tokens signed with it would be refused."
        )
    algorithm = algorithms_for_key(public_key, source="the private key")[0]
    return jwt.encode(claims, private_key, algorithm=algorithm, headers=headers)


def parse_ttl(text: str) -> timedelta:
    """A token lifetime like "8h", "30m", "7d" or "1h30m" (at most a year)."""
    return parse_duration(text, maximum=MAX_TTL, what="Token lifetime")


def _load_private_key(pem: bytes) -> PrivateKey:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        # The message of the underlying error could echo key bytes; keep it out.
        raise ConfigError("The private key is not an unencrypted PEM private key.") from exc
    if not isinstance(key, PrivateKey):
        raise ConfigError("The private key must be RSA, EC or Ed25519/Ed448.")
    return key


def _same_key(public_key: Any, path: Any) -> bool:
    def der(key: Any) -> bytes:
        return bytes(key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo))

    return der(public_key) == der(load_public_key(path))
