"""`GET /api/runs/{id}/diagnosis` beside /mcp: the failure diagnosis of one run over HTTP.

    200  {"status": "pending"|"done"|"failed"|"unavailable", "summary"?, "actionIds"?, "model"?, "error"?}
    401  no or invalid bearer token (verified exactly as for /mcp)
    403  the token lacks runs:read or logs:read
    404  no such run        409  the run did not fail        400  the id is not a number

A failed run without a diagnosis gets one started in the background (as the caller, audited as
`feature:failure-diagnosis`) and answers `pending`; ask again for the result.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from mcp_knecht.app import App
from mcp_knecht.core.auth import TokenVerifier
from mcp_knecht.errors import ConflictError, NotFoundError
from mcp_knecht.transports.decisions_api import ApiError, caller, error_response

DIAGNOSIS_READ_SCOPES = ("runs:read", "logs:read")


def ai_routes(app: App, verifier: TokenVerifier) -> list[Route]:
    async def run_diagnosis(request: Request) -> JSONResponse:
        try:
            actor = await caller(request, verifier)
        except ApiError as exc:
            return error_response(exc.status, exc.code, exc.message)
        missing = [scope for scope in DIAGNOSIS_READ_SCOPES if not actor.holds(scope)]
        if missing:
            return error_response(403, "insufficient_scope", f"This needs scope {' and '.join(missing)}.")
        raw = request.path_params["run_id"]
        if not raw.isdigit() or int(raw) < 1:
            return error_response(400, "bad_request", f"A run id is a positive number, not {raw[:40]!r}.")
        try:
            shown = await app.ai.diagnoses.request(int(raw), actor, wait=False)
        except NotFoundError as exc:
            return error_response(404, "not_found", exc.message)
        except ConflictError as exc:
            return error_response(409, "not_failed", exc.message)
        return JSONResponse(shown)

    return [Route("/api/runs/{run_id}/diagnosis", run_diagnosis, methods=["GET"])]
