"""Where `knecht-approve` reads and decides proposals: the database directly, or a server's API.

Both give the same answers and raise the same errors, so every subcommand prints the same output
and exits with the same code either way.

- `DirectDecisions`: opens the store (and the toolsets, to execute what is approved). The operator
  is the subject of `KNECHT_OPERATOR_TOKEN` when one is set (verified; `--as` cannot override it),
  else — only while `KNECHT_OPERATOR_AUTH` is `local` — the name given with `--as` (default: the
  login name), recorded as `local:NAME`.
- `ServerDecisions`: every request goes to `--server URL` (`KNECHT_SERVER_URL`) with the operator
  token, which the server verifies; it executes what is approved.
"""

from __future__ import annotations

import getpass
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Protocol

from mcp_knecht.core.approval import Operator
from mcp_knecht.core.proposals import Proposal, same_person
from mcp_knecht.core.settings import OPERATOR_AUTH, OPERATOR_TOKEN, SERVER_URL, Settings
from mcp_knecht.errors import (
    AlreadyApprovedError,
    AuthError,
    ConfigError,
    DecisionError,
    HashMismatchError,
    KnechtError,
    NotPendingError,
    SelfApprovalError,
    StoreBusyError,
    TamperedError,
    UsageError,
)

DECIDE = "proposals:decide"
REQUEST_TIMEOUT = 120.0
"""An approval waits for its execution; a slow one must not look like a lost server."""


class Decisions(Protocol):
    async def list(self, *, status: str | None, limit: int, after_id: int = 0) -> list[Proposal]: ...
    async def get(self, proposal_id: int) -> Proposal: ...
    async def approve(self, proposal_id: int, *, expect_hash: str | None) -> Proposal: ...
    async def reject(self, proposal_id: int, *, reason: str) -> Proposal: ...
    async def settle(self, proposal_id: int, *, succeeded: bool, reason: str, force: bool) -> Proposal: ...


def operator_for(settings: Settings, as_name: str | None) -> Operator:
    """Who decides in direct mode (see the module docstring)."""
    if settings.operator_token:
        from mcp_knecht.core.auth import TokenVerifier, load_token_settings

        try:
            verifier = TokenVerifier(load_token_settings(settings, create_dev_secret=False))
            actor = verifier.verify(settings.operator_token)
        except AuthError as exc:
            raise ConfigError(f"{OPERATOR_TOKEN.name} was refused: {exc.message}") from None
        if not actor.holds(DECIDE):
            raise ConfigError(f"{OPERATOR_TOKEN.name} lacks the scope {DECIDE}; mint one with "
                              "`mcp-knecht token mint --sub NAME --profile operator`.")
        if as_name is not None and not same_person(as_name, actor.subject):
            raise UsageError(f"--as {as_name} cannot override the operator token, whose subject is {actor.subject}.")
        return Operator(actor.subject, client=actor.client, verified=True)
    if settings.operator_auth == "token":
        raise UsageError(
            f"This installation requires a verified operator for every decision ({OPERATOR_AUTH.name}=token): set "
            f"{OPERATOR_TOKEN.name} to your operator token, or decide through the server with --server URL."
        )
    name = (as_name if as_name is not None else getpass.getuser()).strip()
    if not name:
        raise UsageError("--as needs a name.")
    return Operator(name)


class DirectDecisions:
    def __init__(self, app: Any, settings: Settings, as_name: str | None) -> None:
        self._app = app
        self._settings = settings
        self._as_name = as_name

    def _operator(self) -> Operator:
        return operator_for(self._settings, self._as_name)

    async def list(self, *, status: str | None, limit: int, after_id: int = 0) -> list[Proposal]:
        found: list[Proposal] = await self._app.proposals.list(status=status, limit=limit, after_id=after_id)
        return found

    async def get(self, proposal_id: int) -> Proposal:
        proposal: Proposal = await self._app.approvals.checked(proposal_id)
        return proposal

    async def approve(self, proposal_id: int, *, expect_hash: str | None) -> Proposal:
        decided: Proposal = await self._app.approvals.approve(proposal_id, self._operator(), expect_hash=expect_hash)
        return decided

    async def reject(self, proposal_id: int, *, reason: str) -> Proposal:
        decided: Proposal = await self._app.approvals.reject(proposal_id, self._operator(), reason)
        return decided

    async def settle(self, proposal_id: int, *, succeeded: bool, reason: str, force: bool) -> Proposal:
        settled: Proposal = await self._app.approvals.settle(proposal_id, self._operator(), succeeded=succeeded,
                                                             note=reason, force=force)
        return settled


_ERRORS: dict[str, type[KnechtError]] = {
    "self_approval": SelfApprovalError, "hash_mismatch": HashMismatchError, "not_pending": NotPendingError,
    "not_found": NotPendingError, "tampered": TamperedError, "usage": UsageError, "bad_request": UsageError,
    "decision": DecisionError, "forbidden": DecisionError, "already_approved": AlreadyApprovedError,
    "store_busy": StoreBusyError,
}


class ServerDecisions:
    def __init__(self, client: Any) -> None:
        """`client`: an `httpx.AsyncClient` with the server's base URL and the operator token."""
        self._client = client

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        import httpx

        try:
            response = await self._client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise KnechtError(f"The server at {self._client.base_url} cannot be reached: {exc}") from None
        try:
            body = response.json()
        except ValueError:
            body = {}
        if response.status_code < 400:
            return body
        error = body.get("error", {}) if isinstance(body, dict) else {}
        message = str(error.get("message") or f"The server answered {response.status_code}.")
        if response.status_code == 401:
            raise ConfigError(f"The server refused the operator token ({OPERATOR_TOKEN.name}): {message}")
        raise _ERRORS.get(str(error.get("code")), KnechtError)(message)

    async def list(self, *, status: str | None, limit: int, after_id: int = 0) -> list[Proposal]:
        found: list[Proposal] = []
        before: int | None = None
        while len(found) < limit:
            params: dict[str, Any] = {"limit": min(200, limit - len(found))}
            if status:
                params["status"] = status
            if before is not None:
                params["before"] = before
            page = await self._call("GET", "/api/proposals", params=params)
            found += [p for p in map(Proposal.from_document, page["proposals"]) if p.id > after_id]
            before = page["next"]
            if before is None or before <= after_id:
                break
        return found[:limit]

    async def get(self, proposal_id: int) -> Proposal:
        return Proposal.from_document(await self._call("GET", f"/api/proposals/{proposal_id}"))

    async def approve(self, proposal_id: int, *, expect_hash: str | None) -> Proposal:
        body = {"expect_hash": expect_hash} if expect_hash is not None else {}
        return Proposal.from_document(await self._call("POST", f"/api/proposals/{proposal_id}/approve", json=body))

    async def reject(self, proposal_id: int, *, reason: str) -> Proposal:
        if not reason.strip():
            raise UsageError("A rejection needs a reason (--reason TEXT): the agent learns from it.")
        return Proposal.from_document(
            await self._call("POST", f"/api/proposals/{proposal_id}/reject", json={"reason": reason}))

    async def settle(self, proposal_id: int, *, succeeded: bool, reason: str, force: bool) -> Proposal:
        body = {"outcome": "succeeded" if succeeded else "failed", "reason": reason, "force": force}
        return Proposal.from_document(await self._call("POST", f"/api/proposals/{proposal_id}/settle", json=body))


@asynccontextmanager
async def open_decisions(settings: Settings, *, server: str | None, as_name: str | None) -> AsyncIterator[Decisions]:
    """The server's API when `server` (or `KNECHT_SERVER_URL`) is given, else the database."""
    base = server or settings.server_url
    if base:
        import httpx

        if not settings.operator_token:
            raise UsageError(f"--server needs your operator token in {OPERATOR_TOKEN.name} "
                             f"(mint one with `mcp-knecht token mint --sub NAME --profile operator`).")
        if as_name is not None:
            raise UsageError(f"--as cannot be used with --server ({SERVER_URL.name}): the server records the "
                             "operator token's subject.")
        headers = {"Authorization": f"Bearer {settings.operator_token}"}
        async with httpx.AsyncClient(base_url=base.rstrip("/"), headers=headers, timeout=REQUEST_TIMEOUT) as client:
            yield ServerDecisions(client)
        return
    from mcp_knecht.app import open_app

    async with open_app(settings, watch_policy=False, blocking_store=True) as app:  # one decision at a time
        yield DirectDecisions(app, settings, as_name)
