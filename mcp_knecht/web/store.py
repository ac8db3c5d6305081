"""The web page's rows in the store: one-time sign-in links and the sessions they start.

    links = LoginLinks(db, keys)
    secret = await links.create("alice", ["projects:read"])     # what `mcp-knecht login-link` prints
    grant = await links.redeem(secret)                          # once; None for a used, expired or forged one

Both live in the store, not in a process, so a link minted on one machine works on any replica, and
a second use is refused on every replica: redeeming is one conditional `UPDATE … WHERE used_at IS
NULL AND expires_at > now`. Only a keyed hash of a link's secret is stored, and a seal (a MAC with the
server key) binds subject and scopes to it: whoever can read the table cannot use a link, and whoever
can write it cannot mint one or widen its scopes.
"""

from __future__ import annotations

import logging
import secrets
from datetime import datetime, timedelta

import anyio
import msgspec

from mcp_knecht.core import clock
from mcp_knecht.core.canonical import canonical_json
from mcp_knecht.core.database import Database
from mcp_knecht.core.keys import ServerKeys
from mcp_knecht.core.schema import Migrations
from mcp_knecht.store.migrations import apply_migrations

logger = logging.getLogger(__name__)

WEB_MIGRATIONS = Migrations("web", "mcp_knecht.web")
"""`mcp_knecht/web/sql/<dialect>/`: the login links and sessions."""
LINK_TTL = timedelta(minutes=10)
"""A sign-in link is good for this long, and for one use."""
_KEEP_AFTER_EXPIRY = timedelta(days=1)


class WebSchema:
    """Applies the web's migrations once per process, on first use (the CLI applies them itself)."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._ready = False
        self._lock = anyio.Lock()

    async def ready(self) -> Database:
        if not self._ready:
            async with self._lock:
                if not self._ready:
                    await apply_migrations(self._db, WEB_MIGRATIONS)
                    self._ready = True
        return self._db


class Grant(msgspec.Struct, frozen=True):
    """What a redeemed link (or a verified token) grants a new session."""

    subject: str
    scopes: frozenset[str]
    not_after: datetime | None = None
    """A hard end (a pasted token's expiry), before the session lifetime runs out."""


def _seal_text(token_hash: str, subject: str, scopes: str, created_at: str, expires_at: str) -> str:
    return canonical_json([token_hash, subject, scopes, created_at, expires_at])


class LoginLinks:
    def __init__(self, schema: WebSchema, keys: ServerKeys) -> None:
        self._schema = schema
        self._keys = keys

    def _hash(self, secret: str) -> str:
        return self._keys.mac("web-login-link", secret)

    async def create(self, subject: str, scopes: list[str], *, ttl: timedelta = LINK_TTL) -> str:
        """A new link's secret (the caller builds the URL); only its keyed hash is stored."""
        db = await self._schema.ready()
        secret = secrets.token_urlsafe(32)
        token_hash, scope_text = self._hash(secret), " ".join(sorted(set(scopes)))
        now = clock.now()
        created, expires = clock.timestamp(now), clock.timestamp(now + ttl)
        seal = self._keys.mac("web-login-link-seal", _seal_text(token_hash, subject, scope_text, created, expires))
        async with db.transaction() as tx:
            await tx.execute("DELETE FROM web_login_links WHERE expires_at < ?",
                             (clock.timestamp(now - _KEEP_AFTER_EXPIRY),))
            await tx.execute(
                "INSERT INTO web_login_links (token_hash, subject, scopes, created_at, expires_at, seal)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (token_hash, subject, scope_text, created, expires, seal),
            )
        return secret

    async def peek(self, secret: str) -> Grant | None:
        """What an unused, unexpired link would grant, without using it (for the confirmation page)."""
        if not secret or len(secret) > 200:
            return None
        db = await self._schema.ready()
        row = await db.fetch_one(
            "SELECT subject, scopes FROM web_login_links WHERE token_hash = ? AND used_at IS NULL AND expires_at > ?",
            (self._hash(secret), clock.timestamp()),
        )
        return Grant(str(row["subject"]), frozenset(str(row["scopes"]).split())) if row else None

    async def redeem(self, secret: str) -> Grant | None:
        """The link's grant, exactly once; None when it is unknown, used, expired or fails its seal."""
        if not secret or len(secret) > 200:
            return None
        db = await self._schema.ready()
        token_hash, now = self._hash(secret), clock.timestamp()
        async with db.transaction() as tx:
            row = await tx.fetch_one(
                "UPDATE web_login_links SET used_at = ? WHERE token_hash = ? AND used_at IS NULL AND expires_at > ?"
                " RETURNING subject, scopes, created_at, expires_at, seal",
                (now, token_hash, now),
            )
        if row is None:
            return None
        sealed = _seal_text(token_hash, row["subject"], row["scopes"], row["created_at"], row["expires_at"])
        if not self._keys.verify("web-login-link-seal", sealed, row["seal"]):
            logger.warning("A sign-in link for %r fails its seal: its row was changed outside mcp-knecht; refused.",
                           str(row["subject"])[:80])
            return None
        return Grant(str(row["subject"]), frozenset(str(row["scopes"]).split()))


class SessionRows:
    """A row per session: signing out (or an admin deleting the row) ends it on every replica."""

    def __init__(self, schema: WebSchema) -> None:
        self._schema = schema

    async def start(self, session_id: str, subject: str, expires_at: str) -> None:
        db = await self._schema.ready()
        now = clock.now()
        async with db.transaction() as tx:
            await tx.execute("DELETE FROM web_sessions WHERE expires_at < ?",
                             (clock.timestamp(now - _KEEP_AFTER_EXPIRY),))
            await tx.execute("INSERT INTO web_sessions (id, subject, created_at, expires_at) VALUES (?, ?, ?, ?)",
                             (session_id, subject, clock.timestamp(now), expires_at))

    async def live(self, session_id: str) -> bool:
        db = await self._schema.ready()
        row = await db.fetch_one("SELECT ended_at, expires_at FROM web_sessions WHERE id = ?", (session_id,))
        return row is not None and row["ended_at"] is None and row["expires_at"] > clock.timestamp()

    async def end(self, session_id: str) -> None:
        db = await self._schema.ready()
        async with db.transaction() as tx:
            await tx.execute("UPDATE web_sessions SET ended_at = ? WHERE id = ? AND ended_at IS NULL",
                             (clock.timestamp(), session_id))
