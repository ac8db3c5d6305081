"""Where token keys come from: an HS256 secret, a PEM public key, or a JWKS URL.

Each key kind brings its own algorithm allow-list, so `alg: none` and HS/RS key confusion
(an HMAC token "signed" with the public PEM as secret) can never verify.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

import msgspec

from mcp_knecht.core import settings as declared
from mcp_knecht.core.hidden_repr import repr_without
from mcp_knecht.core.secret_file import create_secret_file, read_secret_file
from mcp_knecht.core.settings import DEFAULT_AUDIENCE, DEFAULT_ISSUER, Settings
from mcp_knecht.errors import ConfigError

if TYPE_CHECKING:  # `cryptography` loads where a public key is read: an HS256 secret never needs it
    from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa

    PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey | ed448.Ed448PublicKey

ENV_SECRET = declared.JWT_SECRET.name
ENV_PUBLIC_KEY = declared.JWT_PUBLIC_KEY.name
ENV_JWKS_URL = declared.JWKS_URL.name
ENV_ISSUER = declared.JWT_ISSUER.name
ENV_AUDIENCE = declared.JWT_AUDIENCE.name

DEV_SECRET_FILENAME = "jwt-secret"
MIN_SECRET_BYTES = 32
MIN_RSA_BITS = 2048

# HS384/HS512 need a key at least as long as their digest; shorter secrets only get HS256.
_HMAC_MIN_BYTES = {"HS256": 32, "HS384": 48, "HS512": 64}
ASYMMETRIC_ALGORITHMS: tuple[str, ...] = (
    "RS256",
    "RS384",
    "RS512",
    "PS256",
    "PS384",
    "PS512",
    "ES256",
    "ES384",
    "ES512",
    "EdDSA",
)
_EC_ALGORITHM_BY_CURVE = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512"}


class TokenSettings(msgspec.Struct, frozen=True):
    """How tokens are verified (and, with a secret, minted). Exactly one key kind is set."""

    secret: str | None = None
    public_key_path: Path | None = None
    jwks_url: str | None = None
    issuer: str = DEFAULT_ISSUER
    audience: str = DEFAULT_AUDIENCE
    leeway_seconds: int = 30
    # Set when the secret is the generated dev secret, so the CLI can say where it lives.
    dev_secret_path: Path | None = None
    dev_secret_created: bool = False

    def __repr__(self) -> str:
        return repr_without(self, ("secret",))

    def __post_init__(self) -> None:
        configured = [
            name
            for name, value in (
                (ENV_SECRET, self.secret),
                (ENV_PUBLIC_KEY, self.public_key_path),
                (ENV_JWKS_URL, self.jwks_url),
            )
            if value
        ]
        if len(configured) != 1:
            raise ConfigError(
                f"Configure exactly one token key: {ENV_SECRET}, {ENV_PUBLIC_KEY} or {ENV_JWKS_URL}"
                + (f" (got {', '.join(configured)})." if configured else " (none is set).")
            )
        if self.secret is not None and len(self.secret.encode()) < MIN_SECRET_BYTES:
            raise ConfigError(
                f"The JWT secret is too short: it needs at least {MIN_SECRET_BYTES} bytes. "
                'Generate one with: python -c "import secrets; print(secrets.token_urlsafe(48))"'
            )
        if self.jwks_url is not None:
            _check_jwks_url(self.jwks_url)
        if not self.issuer or not self.audience:
            raise ConfigError(f"{ENV_ISSUER} and {ENV_AUDIENCE} must not be empty.")
        if self.leeway_seconds < 0:
            raise ConfigError("The token clock leeway must not be negative.")

    @property
    def key_kind(self) -> str:
        """One of "secret", "public_key" or "jwks"."""
        if self.secret is not None:
            return "secret"
        return "public_key" if self.public_key_path is not None else "jwks"

    @property
    def algorithms(self) -> tuple[str, ...]:
        """The algorithms this key kind may ever accept (the verifier narrows further by key type)."""
        if self.secret is not None:
            length = len(self.secret.encode())
            return tuple(alg for alg, minimum in _HMAC_MIN_BYTES.items() if length >= minimum)
        return ASYMMETRIC_ALGORITHMS

    def describe(self) -> str:
        """Where the key comes from, for startup logs; never the key itself."""
        if self.dev_secret_path is not None:
            verb = "generated" if self.dev_secret_created else "using"
            return f"{verb} dev secret (HS256) at {self.dev_secret_path}"
        if self.secret is not None:
            return f"HS256 secret from {ENV_SECRET}"
        if self.public_key_path is not None:
            return f"public key {self.public_key_path}"
        return f"JWKS at {self.jwks_url}"


def load_token_settings(settings: Settings, *, create_dev_secret: bool) -> TokenSettings:
    """The token key of `settings`; without one, the dev secret `<data dir>/jwt-secret` (made
    on first use when `create_dev_secret`)."""
    common: dict[str, Any] = {"issuer": settings.jwt_issuer, "audience": settings.jwt_audience}
    if settings.jwt_secret or settings.jwt_public_key or settings.jwks_url:
        token_settings = TokenSettings(secret=settings.jwt_secret, public_key_path=settings.jwt_public_key,
                                       jwks_url=settings.jwks_url, **common)
        if settings.jwt_public_key is not None:
            load_public_key(settings.jwt_public_key)  # fail at startup, not on the first request
        return token_settings

    path = settings.data_dir / DEV_SECRET_FILENAME
    created = False
    if not path.exists():
        if not create_dev_secret:
            raise ConfigError(
                f"No token key configured: set {ENV_SECRET}, {ENV_PUBLIC_KEY} or {ENV_JWKS_URL}, "
                f"or start the server once to generate a dev secret at {path}."
            )
        created = create_secret_file(path)
    return TokenSettings(
        secret=read_secret_file(path, what="dev secret", min_bytes=MIN_SECRET_BYTES),
        dev_secret_path=path,
        dev_secret_created=created,
        **common,
    )


def _check_jwks_url(url: str) -> None:
    parts = urlsplit(url)
    loopback = parts.hostname in {"localhost", "127.0.0.1", "::1"}
    # Keys fetched over plain HTTP could be swapped in transit; allow it only on this machine.
    if parts.scheme != "https" and not (parts.scheme == "http" and loopback):
        raise ConfigError(f"{ENV_JWKS_URL} must be an https:// URL (got {url!r}).")


def load_public_key(path: Path) -> PublicKey:
    """Read a PEM public key (or the public key of a PEM certificate) and check it is usable."""
    from cryptography.hazmat.primitives.serialization import load_pem_public_key
    from cryptography.x509 import load_pem_x509_certificate

    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"Cannot read the JWT public key {path}: {exc.strerror}.") from exc
    if b"PRIVATE KEY" in data:
        # Do not parse it: a private key has no business on the verifying side.
        raise ConfigError(f"{path} holds a private key; {ENV_PUBLIC_KEY} needs the public key only.")
    try:
        if b"BEGIN CERTIFICATE" in data:
            key: Any = load_pem_x509_certificate(data).public_key()
        else:
            key = load_pem_public_key(data)
    except ValueError as exc:
        raise ConfigError(f"{path} is not a PEM public key or certificate.") from exc
    algorithms_for_key(key, source=str(path))  # refuses every other kind of key
    return cast("PublicKey", key)


def algorithms_for_key(key: object, *, source: str = "the key") -> tuple[str, ...]:
    """The JWS algorithms that fit this public key's type (and nothing else)."""
    from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa

    if isinstance(key, rsa.RSAPublicKey):
        if key.key_size < MIN_RSA_BITS:
            raise ConfigError(
                f"{source} is an RSA key of {key.key_size} bits; at least {MIN_RSA_BITS} are needed."
            )
        return ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
    if isinstance(key, ec.EllipticCurvePublicKey):
        alg = _EC_ALGORITHM_BY_CURVE.get(key.curve.name)
        if alg is None:
            raise ConfigError(f"{source} uses the unsupported curve {key.curve.name}.")
        return (alg,)
    if isinstance(key, ed25519.Ed25519PublicKey | ed448.Ed448PublicKey):
        return ("EdDSA",)
    raise ConfigError(f"{source} is not an RSA, EC or Ed25519/Ed448 public key.")
