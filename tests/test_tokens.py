"""Token keys, verification and minting: every way a token can be refused, and the good path."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import stat
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import jwt
import msgspec.structs
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from mcp_knecht.core.auth import (
    TokenSettings,
    TokenVerifier,
    load_token_settings,
    mint_token,
    parse_ttl,
)
from mcp_knecht.core.settings import Settings, load_settings
from mcp_knecht.errors import AuthError, ConfigError, UsageError

pytestmark = pytest.mark.anyio

SECRET = secrets.token_urlsafe(48)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def settings() -> TokenSettings:
    return TokenSettings(secret=SECRET)


@pytest.fixture
def verifier(settings: TokenSettings) -> TokenVerifier:
    return TokenVerifier(settings)


def _claims(**overrides: Any) -> dict[str, Any]:
    now = datetime.now(UTC)
    claims: dict[str, Any] = {
        "iss": "mcp-knecht",
        "aud": "mcp-knecht",
        "sub": "alice",
        "iat": now,
        "nbf": now,
        "exp": now + timedelta(hours=1),
        "scope": "projects:read",
    }
    claims.update(overrides)
    return {k: v for k, v in claims.items() if v is not None}


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _hand_made(header: dict[str, Any], claims: dict[str, Any], hmac_key: bytes | None) -> str:
    """Build a JWT without PyJWT, which (rightly) refuses to produce the forgeries we need."""
    body = {k: int(v.timestamp()) if isinstance(v, datetime) else v for k, v in claims.items()}
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(body).encode())}"
    signature = (
        b"" if hmac_key is None else hmac.new(hmac_key, signing_input.encode(), hashlib.sha256).digest()
    )
    return f"{signing_input}.{_b64(signature)}"


def _refused(verifier: TokenVerifier, token: str, *fragments: str) -> str:
    with pytest.raises(AuthError) as info:
        verifier.verify(token)
    message = info.value.message
    for fragment in fragments:
        assert fragment in message, message
    assert SECRET not in message
    assert info.value.code == "unauthenticated"
    return message


def _public_pem(private_key: Any) -> bytes:
    return private_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _private_pem(private_key: Any) -> bytes:
    return private_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


# --- HS256: the good path ------------------------------------------------------------------------


def test_minted_hs256_token_becomes_actor_with_scopes(
    settings: TokenSettings, verifier: TokenVerifier
) -> None:
    token = mint_token(settings, subject="alice", scopes=["runs:read", "projects:read", "runs:read"])
    actor = verifier.verify(token)
    assert actor.subject == "alice"
    assert actor.client == "cli"
    assert actor.scopes == frozenset({"projects:read", "runs:read"})
    assert actor.claims["scope"] == "projects:read runs:read"
    assert jwt.get_unverified_header(token)["alg"] == "HS256"
    for claim in ("iss", "aud", "sub", "iat", "nbf", "exp", "jti", "scope", "client_id"):
        assert claim in actor.claims


def test_minted_token_lifetime_follows_ttl(settings: TokenSettings, verifier: TokenVerifier) -> None:
    token = mint_token(settings, subject="bob", scopes=[], client="cursor", ttl=timedelta(minutes=30))
    actor = verifier.verify(token)
    assert actor.claims["exp"] - actor.claims["iat"] == 30 * 60
    assert actor.client == "cursor"
    assert actor.scopes == frozenset()


def test_two_minted_tokens_have_distinct_jti(settings: TokenSettings) -> None:
    first = jwt.decode(mint_token(settings, subject="a", scopes=[]), options={"verify_signature": False})
    second = jwt.decode(mint_token(settings, subject="a", scopes=[]), options={"verify_signature": False})
    assert first["jti"] != second["jti"]


def test_scp_list_and_azp_client(verifier: TokenVerifier) -> None:
    token = jwt.encode(_claims(scope=None, scp=["a:read", "b:write"], azp="claude-code"), SECRET)
    actor = verifier.verify(token)
    assert actor.scopes == frozenset({"a:read", "b:write"})
    assert actor.client == "claude-code"


def test_client_defaults_to_unknown(verifier: TokenVerifier) -> None:
    assert verifier.verify(jwt.encode(_claims(), SECRET)).client == "unknown"


async def test_averify_with_secret(settings: TokenSettings, verifier: TokenVerifier) -> None:
    actor = await verifier.averify(mint_token(settings, subject="carol", scopes=["x:read"]))
    assert (actor.subject, actor.scopes) == ("carol", frozenset({"x:read"}))


# --- HS256: refusals ---------------------------------------------------------------------------------


def test_forged_signature_is_refused(verifier: TokenVerifier) -> None:
    forged = jwt.encode(_claims(), secrets.token_urlsafe(48))
    _refused(verifier, forged, "signature")


def test_tampered_payload_is_refused(settings: TokenSettings, verifier: TokenVerifier) -> None:
    header, _, signature = mint_token(settings, subject="alice", scopes=["a:read"]).split(".")
    forged = _hand_made({"alg": "HS256", "typ": "JWT"}, _claims(scope="admin:write"), hmac_key=None)
    payload = forged.split(".")[1]
    _refused(verifier, f"{header}.{payload}.{signature}", "signature")


def test_expired_token_is_refused(settings: TokenSettings, verifier: TokenVerifier) -> None:
    past = datetime.now(UTC) - timedelta(hours=2)
    token = mint_token(settings, subject="alice", scopes=[], ttl=timedelta(hours=1), now=past)
    _refused(verifier, token, "expired")


def test_expiry_within_leeway_is_accepted(verifier: TokenVerifier) -> None:
    now = datetime.now(UTC)
    token = jwt.encode(_claims(exp=now - timedelta(seconds=5), iat=now - timedelta(hours=1)), SECRET)
    assert verifier.verify(token).subject == "alice"


def test_not_yet_valid_token_is_refused(settings: TokenSettings, verifier: TokenVerifier) -> None:
    future = datetime.now(UTC) + timedelta(hours=1)
    token = mint_token(settings, subject="alice", scopes=[], now=future)
    _refused(verifier, token, "not yet valid")


def test_wrong_audience_is_refused(verifier: TokenVerifier) -> None:
    _refused(verifier, jwt.encode(_claims(aud="other-service"), SECRET), "audience", "mcp-knecht")


def test_wrong_issuer_is_refused(verifier: TokenVerifier) -> None:
    _refused(verifier, jwt.encode(_claims(iss="evil"), SECRET), "issuer", "mcp-knecht")


def test_configured_issuer_and_audience_are_enforced() -> None:
    settings = TokenSettings(secret=SECRET, issuer="https://idp.example", audience="knecht-prod")
    token = mint_token(settings, subject="alice", scopes=[])
    assert TokenVerifier(settings).verify(token).subject == "alice"
    _refused(TokenVerifier(TokenSettings(secret=SECRET, issuer="https://idp.example")), token, "audience")
    _refused(TokenVerifier(TokenSettings(secret=SECRET, audience="knecht-prod")), token, "issuer")


@pytest.mark.parametrize("claim", ["exp", "aud", "iss", "sub"])
def test_required_claim_missing_is_refused(verifier: TokenVerifier, claim: str) -> None:
    _refused(verifier, jwt.encode(_claims(**{claim: None}), SECRET), repr(claim))


def test_empty_sub_is_refused(verifier: TokenVerifier) -> None:
    _refused(verifier, jwt.encode(_claims(sub="  "), SECRET), "sub")


@pytest.mark.parametrize(
    "claims",
    [
        {"scope": 42},
        {"scope": ["a:read"], "scp": None},
        {"scope": None, "scp": ["a:read", 7]},
        {"scope": None, "scp": ["a:read b:write"]},
        {"scope": None, "scp": {"a": 1}},
    ],
)
def test_malformed_scope_claim_is_refused(verifier: TokenVerifier, claims: dict[str, Any]) -> None:
    _refused(verifier, jwt.encode(_claims(**claims), SECRET), "malformed")


@pytest.mark.parametrize("token", ["", "not-a-jwt", "a.b.c", "x" * 20_000])
def test_malformed_token_is_refused(verifier: TokenVerifier, token: str) -> None:
    with pytest.raises(AuthError):
        verifier.verify(token)


def test_alg_none_is_refused(verifier: TokenVerifier) -> None:
    token = _hand_made({"alg": "none", "typ": "JWT"}, _claims(), hmac_key=None)
    _refused(verifier, token, "'none'", "not allowed")


def test_asymmetric_token_is_refused_with_secret(verifier: TokenVerifier) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    _refused(verifier, jwt.encode(_claims(), key, algorithm="ES256"), "'ES256'", "not allowed")


# --- asymmetric keys from PEM ---------------------------------------------------------------------


def _rsa() -> Any:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


KEY_FACTORIES = {
    "RS256": _rsa,
    "ES256": lambda: ec.generate_private_key(ec.SECP256R1()),
    "EdDSA": ed25519.Ed25519PrivateKey.generate,
}


@pytest.fixture(scope="module")
def rsa_key() -> Any:
    return _rsa()


def _pem_settings(tmp_path: Path, private_key: Any) -> TokenSettings:
    path = tmp_path / "public.pem"
    path.write_bytes(_public_pem(private_key))
    return TokenSettings(public_key_path=path)


@pytest.mark.parametrize("alg", sorted(KEY_FACTORIES))
def test_pem_public_key_verifies_minted_token(tmp_path: Path, alg: str) -> None:
    private_key = KEY_FACTORIES[alg]()
    settings = _pem_settings(tmp_path, private_key)
    token = mint_token(
        settings, subject="svc", scopes=["runs:read"], private_key_pem=_private_pem(private_key)
    )
    assert jwt.get_unverified_header(token)["alg"] == alg
    actor = TokenVerifier(settings).verify(token)
    assert (actor.subject, actor.scopes) == ("svc", frozenset({"runs:read"}))


@pytest.mark.parametrize("alg", sorted(KEY_FACTORIES))
def test_pem_token_signed_by_another_key_is_refused(tmp_path: Path, alg: str) -> None:
    settings = _pem_settings(tmp_path, KEY_FACTORIES[alg]())
    token = jwt.encode(_claims(), KEY_FACTORIES[alg](), algorithm=alg)
    _refused(TokenVerifier(settings), token, "signature")


def test_hs_rs_key_confusion_is_refused(tmp_path: Path, rsa_key: Any) -> None:
    settings = _pem_settings(tmp_path, rsa_key)
    # The classic attack: HMAC over the token with the server's *public* PEM as the secret.
    token = _hand_made({"alg": "HS256", "typ": "JWT"}, _claims(), hmac_key=_public_pem(rsa_key))
    _refused(TokenVerifier(settings), token, "'HS256'", "not allowed")


def test_algorithm_must_fit_key_type(tmp_path: Path) -> None:
    settings = _pem_settings(tmp_path, ec.generate_private_key(ec.SECP256R1()))
    token = jwt.encode(_claims(), ec.generate_private_key(ec.SECP384R1()), algorithm="ES384")
    _refused(TokenVerifier(settings), token, "'ES384'", "not allowed")


def test_minting_asymmetric_needs_private_key(tmp_path: Path, rsa_key: Any) -> None:
    with pytest.raises(ConfigError, match="private key"):
        mint_token(_pem_settings(tmp_path, rsa_key), subject="a", scopes=[])


def test_minting_with_mismatched_private_key_is_refused(tmp_path: Path, rsa_key: Any) -> None:
    with pytest.raises(ConfigError, match="does not match"):
        mint_token(
            _pem_settings(tmp_path, rsa_key), subject="a", scopes=[], private_key_pem=_private_pem(_rsa())
        )


def test_private_key_as_public_key_is_refused(tmp_path: Path, rsa_key: Any) -> None:
    path = tmp_path / "oops.pem"
    path.write_bytes(_private_pem(rsa_key))
    with pytest.raises(ConfigError, match="private key") as info:
        load_token_settings(_settings(tmp_path, {"KNECHT_JWT_PUBLIC_KEY": str(path)}), create_dev_secret=False)
    assert "BEGIN" not in info.value.message


def test_missing_public_key_file_is_refused(tmp_path: Path) -> None:
    env = {"KNECHT_JWT_PUBLIC_KEY": str(tmp_path / "nope.pem")}
    with pytest.raises(ConfigError, match=r"nope\.pem"):
        load_token_settings(_settings(tmp_path, env), create_dev_secret=True)


def test_public_key_from_env(tmp_path: Path, rsa_key: Any) -> None:
    path = tmp_path / "pub.pem"
    path.write_bytes(_public_pem(rsa_key))
    env = {"KNECHT_JWT_PUBLIC_KEY": str(path), "KNECHT_JWT_AUDIENCE": "aud-x", "KNECHT_JWT_ISSUER": "iss-x"}
    settings = load_token_settings(_settings(tmp_path, env), create_dev_secret=True)
    assert (settings.public_key_path, settings.audience, settings.issuer) == (path, "aud-x", "iss-x")
    assert settings.secret is None and settings.dev_secret_path is None
    assert not (tmp_path / "jwt-secret").exists()
    assert "HS256" not in settings.algorithms


# --- JWKS ---------------------------------------------------------------------------------------------


class _JwksServer:
    def __init__(self, jwks: dict[str, Any]) -> None:
        self.hits = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.hits += 1
                body = json.dumps(jwks).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/.well-known/jwks.json"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


@pytest.fixture
def jwks_server(rsa_key: Any) -> Iterator[_JwksServer]:
    ec_key = ec.generate_private_key(ec.SECP256R1())
    rsa_jwk = {**jwt.algorithms.RSAAlgorithm.to_jwk(rsa_key.public_key(), as_dict=True), "kid": "rsa-1"}
    ec_jwk = {**jwt.algorithms.ECAlgorithm.to_jwk(ec_key.public_key(), as_dict=True), "kid": "ec-1"}
    oct_jwk = {"kty": "oct", "k": _b64(SECRET.encode()), "kid": "oct-1", "alg": "HS256"}
    server = _JwksServer({"keys": [rsa_jwk, ec_jwk, oct_jwk]})
    server.ec_key = ec_key  # type: ignore[attr-defined]
    yield server
    server.close()


async def test_jwks_verifies_and_fetches_once(jwks_server: _JwksServer, rsa_key: Any) -> None:
    verifier = TokenVerifier(TokenSettings(jwks_url=jwks_server.url))
    ec_key = jwks_server.ec_key  # type: ignore[attr-defined]
    for i in range(3):
        token = jwt.encode(_claims(sub=f"user-{i}"), rsa_key, algorithm="RS256", headers={"kid": "rsa-1"})
        assert (await verifier.averify(token)).subject == f"user-{i}"
    token = jwt.encode(_claims(), ec_key, algorithm="ES256", headers={"kid": "ec-1"})
    assert verifier.verify(token).subject == "alice"
    assert jwks_server.hits == 1


async def test_jwks_refusals(jwks_server: _JwksServer, rsa_key: Any) -> None:
    verifier = TokenVerifier(TokenSettings(jwks_url=jwks_server.url))
    with pytest.raises(AuthError, match="not in the key set"):
        await verifier.averify(jwt.encode(_claims(), rsa_key, algorithm="RS256", headers={"kid": "nope"}))
    with pytest.raises(AuthError, match="no key id"):
        await verifier.averify(jwt.encode(_claims(), rsa_key, algorithm="RS256"))
    with pytest.raises(AuthError, match="signature"):
        await verifier.averify(jwt.encode(_claims(), _rsa(), algorithm="RS256", headers={"kid": "rsa-1"}))
    # An RS token naming the EC key, and an HS token naming a symmetric JWK, must both fail.
    with pytest.raises(AuthError, match="does not fit"):
        await verifier.averify(jwt.encode(_claims(), rsa_key, algorithm="RS256", headers={"kid": "ec-1"}))
    hs_token = _hand_made({"alg": "HS256", "kid": "oct-1"}, _claims(), hmac_key=SECRET.encode())
    with pytest.raises(AuthError, match="not allowed"):
        await verifier.averify(hs_token)
    with pytest.raises(AuthError, match="expired"):
        past = datetime.now(UTC) - timedelta(hours=3)
        expired = _claims(iat=past, nbf=past, exp=past + timedelta(hours=1))
        await verifier.averify(jwt.encode(expired, rsa_key, algorithm="RS256", headers={"kid": "rsa-1"}))


async def test_jwks_unreachable(rsa_key: Any) -> None:
    server = _JwksServer({"keys": []})
    url = server.url
    server.close()  # nothing listens on that port any more
    verifier = TokenVerifier(TokenSettings(jwks_url=url))
    token = jwt.encode(_claims(), rsa_key, algorithm="RS256", headers={"kid": "rsa-1"})
    with pytest.raises(AuthError, match="unreachable"):
        await verifier.averify(token)


def test_jwks_must_be_https_unless_local() -> None:
    with pytest.raises(ConfigError, match="https"):
        TokenSettings(jwks_url="http://idp.example/jwks.json")
    assert TokenSettings(jwks_url="https://idp.example/jwks.json").key_kind == "jwks"


def _settings(data_dir: Path, env: dict[str, str]) -> Settings:
    return load_settings(env={**env, "KNECHT_DATA_DIR": str(data_dir)})


# --- key configuration and the dev secret ---------------------------------------------------------------


def test_dev_secret_created_private_and_reused(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    first = load_token_settings(_settings(data_dir, {}), create_dev_secret=True)
    path = data_dir / "jwt-secret"
    assert first.dev_secret_path == path and first.dev_secret_created
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert first.secret and len(first.secret) >= 32
    assert str(path) in first.describe() and first.secret not in first.describe()
    assert first.secret not in repr(first)
    assert [p.name for p in data_dir.iterdir()] == ["jwt-secret"]  # no temp file left behind

    second = load_token_settings(_settings(data_dir, {}), create_dev_secret=True)
    assert second.secret == first.secret and not second.dev_secret_created
    token = mint_token(first, subject="dev", scopes=["a:read"])
    assert TokenVerifier(second).verify(token).subject == "dev"


def test_dev_secret_differs_between_data_dirs(tmp_path: Path) -> None:
    a = load_token_settings(_settings(tmp_path / "a", {}), create_dev_secret=True)
    b = load_token_settings(_settings(tmp_path / "b", {}), create_dev_secret=True)
    assert a.secret != b.secret


def test_no_key_and_no_dev_secret_is_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="KNECHT_JWT_SECRET"):
        load_token_settings(_settings(tmp_path, {}), create_dev_secret=False)
    assert not (tmp_path / "jwt-secret").exists()


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_dev_secret_with_wide_permissions_is_refused(tmp_path: Path) -> None:
    load_token_settings(_settings(tmp_path, {}), create_dev_secret=True)
    path = tmp_path / "jwt-secret"
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600") as info:
        load_token_settings(_settings(tmp_path, {}), create_dev_secret=True)
    assert path.read_text().strip() not in info.value.message


def test_env_secret_wins_over_dev_secret(tmp_path: Path) -> None:
    settings = load_token_settings(_settings(tmp_path, {"KNECHT_JWT_SECRET": SECRET}), create_dev_secret=True)
    assert settings.secret == SECRET and settings.dev_secret_path is None
    assert not (tmp_path / "jwt-secret").exists()


def test_short_secret_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="too short") as info:
        load_token_settings(_settings(tmp_path, {"KNECHT_JWT_SECRET": "hunter2"}), create_dev_secret=True)
    assert "hunter2" not in info.value.message
    with pytest.raises(ConfigError):
        TokenSettings(secret="x" * 31)
    assert TokenSettings(secret="x" * 32).algorithms == ("HS256",)


def test_several_keys_configured_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="exactly one"):
        TokenSettings(secret=SECRET, jwks_url="https://idp.example/jwks.json")
    with pytest.raises(ConfigError, match="exactly one"):
        TokenSettings()


# --- minting input and parse_ttl -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [{"subject": ""}, {"scopes": ["two words"]}, {"ttl": timedelta(0)}, {"ttl": timedelta(days=400)}],
)
def test_mint_rejects_bad_input(settings: TokenSettings, kwargs: dict[str, Any]) -> None:
    args: dict[str, Any] = {"subject": "alice", "scopes": ["a:read"], **kwargs}
    with pytest.raises(UsageError):
        mint_token(settings, **args)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8h", timedelta(hours=8)),
        ("30m", timedelta(minutes=30)),
        ("7d", timedelta(days=7)),
        ("3600s", timedelta(seconds=3600)),
        ("1h30m", timedelta(minutes=90)),
        (" 2W ", timedelta(weeks=2)),
    ],
)
def test_parse_ttl(text: str, expected: timedelta) -> None:
    assert parse_ttl(text) == expected


@pytest.mark.parametrize(
    "text", ["", "8", "h", "8x", "-1h", "1.5h", "0m", "400d", "8h and more", "99999999999999d"]
)
def test_parse_ttl_rejects_bad_input(text: str) -> None:
    with pytest.raises(UsageError, match=r"(?i)lifetime"):
        parse_ttl(text)


async def test_a_token_verified_before_is_trusted_again_only_until_it_expires(settings: TokenSettings) -> None:
    strict = TokenVerifier(msgspec.structs.replace(settings, leeway_seconds=0))
    token = mint_token(settings, subject="dana", scopes=["x:read"], ttl=timedelta(seconds=1))
    assert (await strict.averify(token)).subject == "dana"
    assert (await strict.averify(token)).subject == "dana"  # remembered
    forged = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
    with pytest.raises(AuthError, match="signature"):
        await strict.averify(forged)
    await anyio.sleep(1.5)
    with pytest.raises(AuthError, match="expired"):
        await strict.averify(token)
