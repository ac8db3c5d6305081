"""Verify a client's JWT and turn it into an `Actor`. Every refusal is an `AuthError`."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import anyio.to_thread
import jwt

from mcp_knecht.core.actor import Actor
from mcp_knecht.core.auth.keys import TokenSettings, algorithms_for_key, load_public_key
from mcp_knecht.errors import AuthError, ConfigError

# Far above any real token; refuses absurd inputs before base64 decoding them.
MAX_TOKEN_LENGTH = 16_384
JWKS_CACHE_SECONDS = 300
JWKS_TIMEOUT_SECONDS = 10
_REQUIRED_CLAIMS = ["exp", "iss", "aud", "sub"]
VERIFIED_CACHE_SIZE = 4_096
VERIFIED_CACHE_SECONDS = 60.0
"""How long `averify` trusts a token it verified before (never past its `exp`): a key taken out of a
JWKS stops its tokens within this; each HTTP request of a client otherwise pays a signature check."""


class TokenVerifier:
    """Checks signature, algorithm, exp/nbf/iat, iss, aud and sub; builds the `Actor`."""

    def __init__(self, settings: TokenSettings, *, jwks_client: jwt.PyJWKClient | None = None) -> None:
        self.settings = settings
        self._static_key: Any = None
        self._static_algorithms: tuple[str, ...] = ()
        self._jwks: jwt.PyJWKClient | None = None
        self._verified: OrderedDict[str, tuple[Actor, float]] = OrderedDict()
        if settings.secret is not None:
            self._static_key = settings.secret
            self._static_algorithms = settings.algorithms
        elif settings.public_key_path is not None:
            self._static_key = load_public_key(settings.public_key_path)
            self._static_algorithms = tuple(
                alg for alg in algorithms_for_key(self._static_key) if alg in settings.algorithms
            )
        else:
            assert settings.jwks_url is not None
            # The key set is cached for `lifespan`; an unknown kid triggers at most one refetch.
            self._jwks = jwks_client or jwt.PyJWKClient(
                settings.jwks_url,
                cache_jwk_set=True,
                lifespan=JWKS_CACHE_SECONDS,
                cache_keys=True,
                timeout=JWKS_TIMEOUT_SECONDS,
            )

    def _remembered(self, token: str) -> Actor | None:
        found = self._verified.get(token)
        if found is None:
            return None
        actor, until = found
        if time.time() < until:
            return actor
        del self._verified[token]
        return None

    def _remember(self, token: str, actor: Actor) -> None:
        exp = actor.claims.get("exp")
        until = time.time() + VERIFIED_CACHE_SECONDS
        if isinstance(exp, int | float):  # as jwt.decode judges it: `exp` plus the leeway
            until = min(until, exp + self.settings.leeway_seconds)
        self._verified[token] = (actor, until)
        while len(self._verified) > VERIFIED_CACHE_SIZE:
            self._verified.popitem(last=False)

    def verify(self, token: str) -> Actor:
        """Verify synchronously. With a JWKS URL this may block on a network fetch."""
        header = self._header(token)
        key, algorithms = self._resolve_key(token, header)
        return self._decode(token, key, algorithms)

    async def averify(self, token: str) -> Actor:
        """Verify without blocking the event loop (the JWKS fetch runs in a worker thread). A token
        verified within the last `VERIFIED_CACHE_SECONDS` (and not expired) is not checked again."""
        if isinstance(token, str) and len(token) <= MAX_TOKEN_LENGTH and (actor := self._remembered(token)):
            return actor
        header = self._header(token)
        if self._jwks is None:
            key, algorithms = self._resolve_key(token, header)
        else:
            key, algorithms = await anyio.to_thread.run_sync(self._resolve_key, token, header)
        actor = self._decode(token, key, algorithms)
        self._remember(token, actor)
        return actor

    def _header(self, token: str) -> dict[str, Any]:
        if not isinstance(token, str) or not token.strip():
            raise AuthError("No token given.")
        if len(token) > MAX_TOKEN_LENGTH:
            raise AuthError("Malformed token: it is too long to be a JWT.")
        try:
            header = jwt.get_unverified_header(token.strip())
        except jwt.PyJWTError as exc:
            raise AuthError("Malformed token: not a JWT (expected header.payload.signature).") from exc
        alg = header.get("alg")
        allowed = self.settings.algorithms if self._jwks is not None else self._static_algorithms
        if alg not in allowed:
            raise AuthError(
                f"Token algorithm {alg!r} is not allowed; this server accepts {', '.join(allowed)}."
            )
        return header

    def _resolve_key(self, token: str, header: Mapping[str, Any]) -> tuple[Any, list[str]]:
        alg = header["alg"]
        if self._jwks is None:
            return self._static_key, [alg]
        try:
            signing_key = self._jwks.get_signing_key_from_jwt(token.strip())
        except jwt.PyJWKClientConnectionError as exc:
            raise AuthError(
                f"Cannot verify the token: the key set at {self.settings.jwks_url} is unreachable."
            ) from exc
        except jwt.PyJWTError as exc:
            kid = header.get("kid")
            raise AuthError(
                f"Token key id {kid!r} is not in the key set at {self.settings.jwks_url}."
                if kid
                else "Token has no key id (kid); it is needed to pick the key from the JWKS."
            ) from exc
        try:
            fitting = algorithms_for_key(signing_key.key, source=f"JWKS key {signing_key.key_id!r}")
        except ConfigError as exc:
            raise AuthError(f"Cannot verify the token: {exc.message}") from exc
        # The key's type decides, not the token: an "oct" key or a family mismatch never verifies.
        if alg not in fitting:
            raise AuthError(f"Token algorithm {alg!r} does not fit the key it names.")
        return signing_key.key, [alg]

    def _decode(self, token: str, key: Any, algorithms: list[str]) -> Actor:
        settings = self.settings
        try:
            claims = jwt.decode(
                token.strip(),
                key,
                algorithms=algorithms,
                audience=settings.audience,
                issuer=settings.issuer,
                leeway=settings.leeway_seconds,
                options={"require": _REQUIRED_CLAIMS},
            )
        except jwt.ExpiredSignatureError as exc:
            raise AuthError("Token has expired; get a new one (mcp-knecht token mint).") from exc
        except jwt.ImmatureSignatureError as exc:
            raise AuthError("Token is not yet valid (nbf/iat lies in the future); check the clocks.") from exc
        except jwt.InvalidAudienceError as exc:
            raise AuthError(
                f"Token is for another audience; this server expects aud={settings.audience!r}."
            ) from exc
        except jwt.InvalidIssuerError as exc:
            raise AuthError(
                f"Token comes from an untrusted issuer; this server expects iss={settings.issuer!r}."
            ) from exc
        except jwt.MissingRequiredClaimError as exc:
            raise AuthError(f"Token lacks the required claim {exc.claim!r}.") from exc
        except jwt.InvalidSignatureError as exc:
            # Subclass of DecodeError, so it must come first.
            raise AuthError("Token signature is invalid: it was not signed with this server's key.") from exc
        except jwt.InvalidAlgorithmError as exc:
            raise AuthError("Token algorithm is not allowed for this server's key.") from exc
        except jwt.DecodeError as exc:
            raise AuthError(f"Malformed token: {exc}") from exc
        except jwt.PyJWTError as exc:
            raise AuthError(f"Token rejected: {exc}") from exc
        return actor_from_claims(claims)


def actor_from_claims(claims: dict[str, Any]) -> Actor:
    """Build the Actor from already verified claims."""
    subject = claims.get("sub")
    if not isinstance(subject, str) or not subject.strip():
        raise AuthError("Token claim 'sub' must be a non-empty string.")
    client = claims.get("client_id") or claims.get("azp") or "unknown"
    if not isinstance(client, str):
        raise AuthError("Token claim 'client_id'/'azp' must be a string.")
    return Actor(subject=subject, client=client, scopes=_scopes(claims), claims=dict(claims))


def _scopes(claims: Mapping[str, Any]) -> frozenset[str]:
    scopes: set[str] = set()
    for name in ("scope", "scp"):
        if name not in claims:
            continue
        value = claims[name]
        # `scope` is a string (RFC 8693); some identity providers send `scp` as one too.
        if isinstance(value, str):
            scopes.update(value.split())
        elif (
            name == "scp"
            and isinstance(value, list)
            and all(isinstance(item, str) and item and not any(ch.isspace() for ch in item) for item in value)
        ):
            scopes.update(value)
        else:
            raise AuthError(
                f"Token claim {name!r} is malformed: expected a space-separated string "
                "or a list of scope names."
            )
    return frozenset(scopes)
