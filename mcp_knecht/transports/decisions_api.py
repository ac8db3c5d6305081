"""The decision API: operators review and decide proposals over HTTP, as verified subjects.

    GET  /api/proposals?status=S&limit=N&before=ID   → {"proposals": [...], "next": ID | null}
    GET  /api/proposals/{id}                         → one proposal
    POST /api/proposals/{id}/approve  {"expect_hash"?: "<hex prefix ≥ 8>"}  → the proposal after execution
    POST /api/proposals/{id}/reject   {"reason": "..."}                      → the proposal
    POST /api/proposals/{id}/settle   {"outcome": "succeeded"|"failed", "reason": "...", "force"?: bool}

Every request carries `Authorization: Bearer <JWT>`, verified exactly as for `/mcp`. A holder of
`proposals:decide` sees every proposal and may decide; everyone else sees only their own and decides
nothing. `decided_by` is the verified subject. Errors are `{"error": {"code", "message"}}` with
401 (no or bad token), 403 (no `proposals:decide`, self-approval, hash mismatch), 404 (unknown, or
another subject's for a non-operator), 409 (not pending: says who decided; a broken seal), 400 (a bad
body or query).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from mcp_knecht.app import App
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.approval import Operator
from mcp_knecht.core.auth import TokenVerifier
from mcp_knecht.core.proposals import STATUSES, Proposal
from mcp_knecht.errors import (
    AuthError,
    DecisionError,
    HashMismatchError,
    KnechtError,
    NotPendingError,
    SelfApprovalError,
    StoreBusyError,
    StoreInterruptedError,
    TamperedError,
    UnknownProposalError,
    UsageError,
)

logger = logging.getLogger(__name__)

DECIDE = "proposals:decide"
MAX_PAGE = 200
MAX_BODY_BYTES = 16_384
_STATUS_OF: list[tuple[type[KnechtError], int]] = [
    (AuthError, 401), (SelfApprovalError, 403), (HashMismatchError, 403), (UsageError, 400),
    (UnknownProposalError, 404), (TamperedError, 409), (NotPendingError, 409), (DecisionError, 409),
    (StoreBusyError, 503), (StoreInterruptedError, 503),
]


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def error_response(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status,
                        headers={"WWW-Authenticate": 'Bearer error="invalid_token"'} if status == 401 else None)


async def caller(request: Request, verifier: TokenVerifier) -> Actor:
    """The verified actor of a request's bearer token; `ApiError` 401 otherwise."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "unauthenticated", "This API needs `Authorization: Bearer <token>`; mint an operator "
                                               "token with `mcp-knecht token mint --sub NAME --profile operator`.")
    try:
        return await verifier.averify(token.strip())
    except AuthError as exc:
        raise ApiError(401, "unauthenticated", exc.message) from None


async def _body(request: Request, allowed: set[str]) -> dict[str, Any]:
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise ApiError(400, "bad_request", f"The body is larger than {MAX_BODY_BYTES} bytes.")
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "bad_request", "The body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise ApiError(400, "bad_request", "The body must be a JSON object.")
    if unknown := sorted(set(body) - allowed):
        takes = ", ".join(sorted(allowed))
        raise ApiError(400, "bad_request", f"Unknown field {unknown[0]!r}; this route takes: {takes}.")
    return body


def _text(body: dict[str, Any], name: str, *, required: bool) -> str | None:
    value = body.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or (required and not value.strip()):
        raise ApiError(400, "bad_request", f"`{name}` must be a non-empty string.")
    return value


def _proposal_id(request: Request) -> int:
    raw = request.path_params["proposal_id"]
    if not raw.isdigit() or not 0 < int(raw) < 2**63:
        raise ApiError(404, "not_found", f"Proposal {raw[:40]!r} does not exist.")
    return int(raw)


def _int_query(request: Request, name: str, default: int | None, low: int, high: int) -> int | None:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or not low <= int(raw) <= high:
        raise ApiError(400, "bad_request", f"`{name}` must be an integer from {low} to {high}.")
    return int(raw)


def _internal(request: Request) -> JSONResponse:
    """Log the exception in flight; the caller gets only a reference to it."""
    reference = uuid.uuid4().hex[:12]
    logger.exception("Internal error on %s %s (reference %s)", request.method, request.url.path[:200], reference)
    return error_response(500, "internal", f"Internal error (reference {reference}); the server log has details.")


class DecisionApi:
    def __init__(self, app: App, verifier: TokenVerifier) -> None:
        self._app = app
        self._verifier = verifier

    async def _visible(self, proposal_id: int, actor: Actor) -> Proposal:
        """The proposal, as the caller may see it: another subject's looks exactly like a missing one."""
        try:
            proposal = await self._app.approvals.checked(proposal_id, reader=actor.subject)
        except NotPendingError:
            proposal = None
        if proposal is None or not (actor.holds(DECIDE) or proposal.proposer_subject == actor.subject):
            raise ApiError(404, "not_found", f"Proposal #{proposal_id} does not exist.")
        return proposal

    @staticmethod
    def _operator(actor: Actor) -> Operator:
        if not actor.holds(DECIDE):
            raise ApiError(403, "forbidden", f"Deciding proposals needs the scope {DECIDE}.")
        return Operator(actor.subject, client=actor.client, verified=True)

    async def list_proposals(self, request: Request, actor: Actor) -> JSONResponse:
        status = request.query_params.get("status")
        if status is not None and status not in STATUSES:
            raise ApiError(400, "bad_request", f"`status` must be one of: {', '.join(STATUSES)}.")
        limit = _int_query(request, "limit", 50, 1, MAX_PAGE) or 50
        before = _int_query(request, "before", None, 1, 2**63 - 1)
        found = await self._app.proposals.list(
            status=status, subject=None if actor.holds(DECIDE) else actor.subject, limit=limit + 1, before_id=before)
        page = found[:limit]
        return JSONResponse({"proposals": [p.document() for p in page],
                             "next": page[-1].id if len(found) > limit else None})

    async def get_proposal(self, request: Request, actor: Actor) -> JSONResponse:
        return JSONResponse((await self._visible(_proposal_id(request), actor)).document())

    async def approve(self, request: Request, actor: Actor) -> JSONResponse:
        proposal_id = _proposal_id(request)
        if not actor.holds(DECIDE):  # a 404 for another's proposal, else the 403 of `_operator`
            await self._visible(proposal_id, actor)
        operator = self._operator(actor)
        expect_hash = _text(await _body(request, {"expect_hash"}), "expect_hash", required=False)
        # An operator sees every proposal: `approve` starts from where it stands (a lost race is one short row).
        decided = await self._app.approvals.approve(proposal_id, operator, expect_hash=expect_hash)
        return JSONResponse(decided.document())

    async def reject(self, request: Request, actor: Actor) -> JSONResponse:
        proposal_id = _proposal_id(request)
        await self._visible(proposal_id, actor)
        operator = self._operator(actor)
        reason = _text(await _body(request, {"reason"}), "reason", required=True)
        assert reason is not None
        return JSONResponse((await self._app.approvals.reject(proposal_id, operator, reason)).document())

    async def settle(self, request: Request, actor: Actor) -> JSONResponse:
        proposal_id = _proposal_id(request)
        await self._visible(proposal_id, actor)
        operator = self._operator(actor)
        body = await _body(request, {"outcome", "reason", "force"})
        if body.get("outcome") not in ("succeeded", "failed"):
            raise ApiError(400, "bad_request", "`outcome` must be 'succeeded' or 'failed'.")
        reason = _text(body, "reason", required=True)
        if not isinstance(body.get("force", False), bool):
            raise ApiError(400, "bad_request", "`force` must be true or false.")
        settled = await self._app.approvals.settle(proposal_id, operator, succeeded=body["outcome"] == "succeeded",
                                                   note=reason or "", force=bool(body.get("force", False)))
        return JSONResponse(settled.document())

    def _endpoint(self, handler: Callable[[Request, Actor], Awaitable[JSONResponse]]) -> Callable[
            [Request], Awaitable[JSONResponse]]:
        async def endpoint(request: Request) -> JSONResponse:
            try:
                return await handler(request, await caller(request, self._verifier))
            except ApiError as exc:
                return error_response(exc.status, exc.code, exc.message)
            except KnechtError as exc:
                status = next((code for kind, code in _STATUS_OF if isinstance(exc, kind)), None)
                if status is not None:
                    return error_response(status, exc.code, exc.message)
                return _internal(request)
            except Exception:
                return _internal(request)

        return endpoint

    def routes(self) -> list[Route]:
        return [
            Route("/api/proposals", self._endpoint(self.list_proposals), methods=["GET"]),
            Route("/api/proposals/{proposal_id}", self._endpoint(self.get_proposal), methods=["GET"]),
            Route("/api/proposals/{proposal_id}/approve", self._endpoint(self.approve), methods=["POST"]),
            Route("/api/proposals/{proposal_id}/reject", self._endpoint(self.reject), methods=["POST"]),
            Route("/api/proposals/{proposal_id}/settle", self._endpoint(self.settle), methods=["POST"]),
        ]
