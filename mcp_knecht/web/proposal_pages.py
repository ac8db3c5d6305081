"""The review of proposals (seed 004's "review in the main window"), on the decision API's own rules.

    GET  /proposals                   open proposals, newest first, `?status=S` (or `all`), `?before=ID` pages;
                                      with `Accept: text/event-stream`: new ones as they are staged (`?after=ID`)
    GET  /proposals/{id}              the frozen call: tool, action, proposer, masked arguments, hash, preview,
                                      diff; Approve / Reject for operators (`?part=decision`: that part alone)
    POST /proposals/{id}              decision=approve (with the hash the page showed) | reject (with a reason)

As in the API: a holder of `proposals:decide` sees every proposal and decides; everyone else sees
only their own (another subject's looks exactly like a missing one) and gets no buttons. Decisions
run through the same `ApprovalService` as the API and the CLI, as the session's verified subject.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from mcp_knecht.core.approval import Operator
from mcp_knecht.core.proposals import OPEN, STATUSES, Proposal
from mcp_knecht.errors import (
    DecisionError,
    HashMismatchError,
    NotPendingError,
    SelfApprovalError,
    TamperedError,
    UsageError,
)
from mcp_knecht.web.pages import View, Web, positive_int
from mcp_knecht.web.reads import PageError
from mcp_knecht.web.sessions import WEB_CLIENT

DECIDE = "proposals:decide"
READ = "proposals:read"
PAGE_SIZE = 50
DEFAULT_STATUS = "pending"
STREAM_SECONDS = 300.0
"""A live list's stream ends after this long; the browser reconnects (and picks up where it was)."""
KEEPALIVE_SECONDS = 15.0
POLL_FLOOR_SECONDS = 0.5
REFRESH_MS = 2000
AI_ACTIONS = ("create", "edit", "delete")
MAX_AI_PREVIEW = 2000


def _check_reader(view: View) -> None:
    if not (view.actor.holds(READ) or view.actor.holds(DECIDE)):
        raise PageError(403, f"Proposals need the scope {READ} (your own) or {DECIDE} (every one), which your "
                             "session does not hold.")


def _subject_filter(view: View) -> str | None:
    return None if view.actor.holds(DECIDE) else view.actor.subject


def _status_filter(view: View) -> str | None:
    status = view.request.query_params.get("status", DEFAULT_STATUS)
    if status in ("", "all"):
        return None
    if status not in STATUSES:
        raise PageError(400, f"status must be one of: all, {', '.join(STATUSES)}.")
    return status


# --- the list ----------------------------------------------------------------------------------------


async def proposals_page(view: View) -> Response:
    _check_reader(view)
    status = _status_filter(view)
    if "text/event-stream" in view.request.headers.get("accept", ""):
        return _live(view, status)
    before = positive_int(view.request.query_params.get("before"), "before")
    found = await view.app.proposals.list(status=status, subject=_subject_filter(view), limit=PAGE_SIZE + 1,
                                          before_id=before)
    page = found[:PAGE_SIZE]
    return view.render("proposals.html", proposals=page, status=status or "all", statuses=STATUSES,
                       next=page[-1].id if len(found) > PAGE_SIZE else None, before=before,
                       newest=page[0].id if page else 0, may_decide=view.actor.holds(DECIDE))


def _event(name: str, event_id: int, html: str) -> str:
    data = "".join(f"data: {line}\n" for line in html.splitlines() or [""])
    return f"event: {name}\nid: {event_id}\n{data}\n"


def _live(view: View, status: str | None) -> Response:
    """New proposals (as table rows) from `after` on, pushed as they are staged — at once where the
    store pushes changes (PostgreSQL), else within a second."""
    last_event = view.request.headers.get("last-event-id", "")
    raw_after = view.request.query_params.get("after", "0")
    after = max(int(raw_after) if raw_after.isdigit() and len(raw_after) < 19 else 0,
                int(last_event) if last_event.isdigit() and len(last_event) < 19 else 0)
    subject = _subject_filter(view)
    app, sessions = view.app, view.web.sessions

    async def events() -> AsyncIterator[str]:
        nonlocal after
        yield "retry: 3000\n\n"
        started = quiet_since = time.monotonic()
        async with app.changes.watching("proposals") as wakeups:
            while time.monotonic() - started < STREAM_SECONDS:
                if await sessions.current(view.request) is None:
                    yield "event: signed-out\ndata: \n\n"
                    return
                fresh = await app.proposals.list(status=status, subject=subject, after_id=after, oldest_first=True,
                                                 limit=PAGE_SIZE)
                for proposal in fresh:
                    after = proposal.id
                    yield _event("proposal", proposal.id,
                                 view.fragment("_proposal_row.html", p=proposal, fresh=True))
                if fresh or time.monotonic() - quiet_since > KEEPALIVE_SECONDS:
                    quiet_since = time.monotonic()
                    if not fresh:
                        yield ": keep-alive\n\n"
                await wakeups.wait(KEEPALIVE_SECONDS)
                await anyio.sleep(POLL_FLOOR_SECONDS)

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


# --- one proposal ------------------------------------------------------------------------------------


async def _visible(view: View, proposal_id: int) -> Proposal:
    """As the API shows it: another subject's proposal looks exactly like a missing one."""
    try:
        proposal = await view.app.approvals.checked(proposal_id, reader=view.actor.subject)
    except NotPendingError:
        proposal = None
    except TamperedError as exc:
        raise PageError(409, exc.message, title="Refused") from None
    if proposal is None or not (view.actor.holds(DECIDE) or proposal.proposer_subject == view.actor.subject):
        raise PageError(404, f"Proposal #{proposal_id} does not exist.")
    return proposal


def _ai_banner(view: View) -> dict[str, str] | None:
    """What the assistant said when it opened this page (`aiAction`, `aiPreview`): shown, never trusted."""
    action = view.request.query_params.get("aiAction")
    if action not in AI_ACTIONS:
        return None
    raw = view.request.query_params.get("aiPreview", "")[:MAX_AI_PREVIEW]
    try:
        preview = json.dumps(json.loads(raw), indent=2, ensure_ascii=False) if raw else ""
    except ValueError:
        preview = raw
    return {"action": action, "preview": preview}


def _decision_context(view: View, proposal: Proposal) -> dict[str, Any]:
    return {"p": proposal, "may_decide": view.actor.holds(DECIDE) and proposal.status == "pending",
            "live": proposal.status in OPEN, "refresh_ms": REFRESH_MS}


def _show(view: View, proposal: Proposal, status: int = 200, error: str | None = None) -> Response:
    return view.render("proposal.html", status, error=error, banner=_ai_banner(view),
                       **_decision_context(view, proposal))


async def proposal_page(view: View) -> Response:
    _check_reader(view)
    proposal = await _visible(view, positive_int(view.request.path_params["proposal_id"], "id") or 0)
    if view.request.query_params.get("part") == "decision":
        return HTMLResponse(view.fragment("_decision.html", **_decision_context(view, proposal)))
    return _show(view, proposal)


_REFUSALS: list[tuple[type[Exception], int]] = [
    (SelfApprovalError, 403), (HashMismatchError, 403), (UsageError, 400), (TamperedError, 409),
    (NotPendingError, 409), (DecisionError, 409),
]


async def decide(view: View) -> Response:
    form = await view.form()
    _check_reader(view)
    proposal_id = positive_int(view.request.path_params["proposal_id"], "id") or 0
    proposal = await _visible(view, proposal_id)
    if not view.actor.holds(DECIDE):
        raise PageError(403, f"Deciding proposals needs the scope {DECIDE}.")
    operator = Operator(view.actor.subject, client=WEB_CLIENT, verified=True)
    decision, expect_hash, reason = (form.get("decision"), form.get("expect_hash"), form.get("reason"))
    try:
        if decision == "approve":
            if not isinstance(expect_hash, str) or not expect_hash:
                raise UsageError("Approving from the page needs the hash the page showed; reload it and try again.")
            await view.app.approvals.approve(proposal_id, operator, expect_hash=expect_hash)
        elif decision == "reject":
            await view.app.approvals.reject(proposal_id, operator, reason if isinstance(reason, str) else "")
        else:
            raise UsageError("Choose Approve or Reject.")
    except (SelfApprovalError, HashMismatchError, UsageError, TamperedError, DecisionError) as exc:
        status = next(code for kind, code in _REFUSALS if isinstance(exc, kind))
        current = await _visible(view, proposal_id) if not isinstance(exc, TamperedError) else proposal
        return _show(view, current, status, error=exc.message)
    return RedirectResponse(f"/proposals/{proposal_id}", status_code=303)


def routes(web: Web) -> list[Route]:
    return [
        Route("/proposals", web.page(proposals_page), methods=["GET"]),
        Route("/proposals/{proposal_id}", web.page(proposal_page), methods=["GET"]),
        Route("/proposals/{proposal_id}", web.page(decide), methods=["POST"]),
    ]
