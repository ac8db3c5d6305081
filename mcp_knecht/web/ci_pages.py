"""The CI pages: projects with their status cards, a run with its actions and logs, a workflow's
definition with one action opened.

    GET /                          projects, a status card each (`?card=ID`: that card alone, for live updates)
    GET /runs/{id}                 the run, its actions, one action's log (`?action=ID|NAME`, `?offset=N`)
    GET /workflows/{id}            the definition (`?action=NAME` opened and scrolled to, `?version=N`)
"""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from mcp_knecht.web.diagnosis import DiagnosisCard
from mcp_knecht.web.pages import View, Web, positive_int
from mcp_knecht.web.reads import PageError, read

LOG_LINES = 200
LIVE_RUN = ("queued", "running")
REFRESH_MS = 3000
"""How often a card whose diagnosis is pending asks for itself again."""
RUN_REFRESH_MS = 15000
"""How often a card whose run is still queued or running does (each look is a few audited reads)."""


# --- the dashboard ---------------------------------------------------------------------------------


async def _card(view: View, project: dict[str, Any]) -> dict[str, Any]:
    run: dict[str, Any] | None = None
    diagnosis: DiagnosisCard | None = None
    run_id, status = project.get("latest_run_id"), project.get("latest_run_status")
    if run_id and view.actor.holds("runs:read"):
        run = await read(view.app, view.actor, "get_run", {"run_id": run_id})
        status = run.get("status", status)
    if run_id and status == "failed":
        diagnosis = DiagnosisCard.of(await view.web.diagnosis(view.actor, int(run_id)), run)
    waiting = diagnosis is not None and not diagnosis.final
    return {"project": project, "run": run, "status": status, "diagnosis": diagnosis,
            "live": waiting or status in LIVE_RUN, "refresh_ms": REFRESH_MS if waiting else RUN_REFRESH_MS}


async def dashboard(view: View) -> Response:
    projects = (await read(view.app, view.actor, "list_projects", {})).get("projects", [])
    wanted = positive_int(view.request.query_params.get("card"), "card")
    if wanted is not None:
        project = next((p for p in projects if p.get("id") == wanted), None)
        if project is None:
            raise PageError(404, f"Project {wanted} does not exist.")
        return HTMLResponse(view.fragment("_card.html", card=await _card(view, project)))
    cards = [await _card(view, project) for project in projects]
    return view.render("dashboard.html", cards=cards)


# --- a run -------------------------------------------------------------------------------------------


def _chosen_action(run: dict[str, Any], wanted: str | None) -> dict[str, Any] | None:
    """The action whose log the page shows: the one asked for, else the failed one, else the last."""
    actions = run.get("actions") or []
    run_log = {"id": 0, "name": "Run log", "status": run.get("status"), "log_lines": run.get("run_log_lines", 0)}
    if wanted is not None and wanted != "":
        if wanted == "0":
            return run_log
        for action in actions:
            if str(action["id"]) == wanted or action["name"] == wanted:
                return dict(action)
        raise PageError(404, f"Run {run['id']} has no action {wanted[:60]!r}.")
    failed = next((a for a in actions if a.get("status") == "failed"), None)
    with_log = [a for a in actions if a.get("log_lines")]
    return dict(failed or (with_log[-1] if with_log else run_log))


def _pager(log: dict[str, Any]) -> dict[str, int | None]:
    first, last, total = log.get("first_line"), log.get("last_line"), int(log.get("total_lines") or 0)
    return {
        "earlier": max((first or 1) - 1 - LOG_LINES, 0) if first and first > 1 else None,
        "later": last if last is not None and last < total else None,
        "at_end": int(last is None or last >= total),
    }


async def run_page(view: View) -> Response:
    run_id = positive_int(view.request.path_params["run_id"], "id")
    run = await read(view.app, view.actor, "get_run", {"run_id": run_id})
    diagnosis = None
    if run.get("status") == "failed":
        diagnosis = DiagnosisCard.of(await view.web.diagnosis(view.actor, int(run["id"])), run)
    if view.request.query_params.get("part") == "diagnosis":
        if diagnosis is None:
            raise PageError(404, f"Run {run_id} has no diagnosis.")
        return HTMLResponse(view.fragment("_diagnosis.html", diagnosis=diagnosis, refresh_ms=REFRESH_MS,
                                          refresh_url=f"/runs/{run_id}?part=diagnosis"))
    action = _chosen_action(run, view.request.query_params.get("action"))
    offset = view.request.query_params.get("offset")
    log: dict[str, Any] | None = None
    log_error: str | None = None
    if action is not None:
        if not view.actor.holds("logs:read"):
            log_error = "Reading logs needs the scope logs:read, which your session does not hold."
        else:
            window: dict[str, Any] = ({"offset": int(offset), "limit": LOG_LINES} if offset and offset.isdigit()
                                      else {"tail": LOG_LINES})
            try:
                log = await read(view.app, view.actor, "get_action_log",
                                 {"run_id": run["id"], "action": action["id"], **window})
            except PageError as exc:
                log_error = exc.message
    return view.render("run.html", run=run, action=action, log=log, log_error=log_error,
                       pager=_pager(log) if log else None, diagnosis=diagnosis, refresh_ms=REFRESH_MS)


# --- a workflow ----------------------------------------------------------------------------------------


class Section(msgspec.Struct, frozen=True):
    name: str | None
    """The action's name; None for the lines around the actions."""
    lines: list[tuple[int, str]]

    @property
    def anchor(self) -> str:
        return f"action-{self.name}" if self.name else "definition"


def split_definition(definition: str) -> list[Section]:
    """The definition in sections: the head (up to `actions:`), one per action, and what follows."""
    numbered = list(enumerate(definition.splitlines(), start=1))
    sections: list[Section] = []
    current: list[tuple[int, str]] = []
    name: str | None = None
    in_actions = False
    item_indent: int | None = None
    for number, line in numbered:
        stripped = line.lstrip()
        indent = len(line) - len(stripped)
        if not in_actions:
            current.append((number, line))
            if line.rstrip() == "actions:":
                in_actions = True
            continue
        top_level = stripped and indent == 0 and not stripped.startswith(("-", "#"))
        starts_item = stripped.startswith("- ") and (item_indent is None or indent == item_indent)
        if top_level:
            sections.append(Section(name, current))
            current, name, in_actions = [(number, line)], None, False
            continue
        if starts_item:
            item_indent = indent
            sections.append(Section(name, current))
            current = [(number, line)]
            body = stripped[2:].strip()
            name = body.split(":", 1)[1].strip().strip("'\"") if body.startswith("name:") else f"step {number}"
            continue
        current.append((number, line))
    sections.append(Section(name, current))
    return [s for s in sections if s.lines]


async def workflow_page(view: View) -> Response:
    workflow_id = positive_int(view.request.path_params["workflow_id"], "id")
    version = positive_int(view.request.query_params.get("version"), "version")
    arguments: dict[str, Any] = {"workflow": workflow_id, **({"version": version} if version else {})}
    workflow = await read(view.app, view.actor, "get_workflow", arguments)
    sections = split_definition(str(workflow.get("definition") or ""))
    wanted = view.request.query_params.get("action")
    names = {s.name for s in sections if s.name}
    focus: str | None = None
    notice: str | None = None
    if wanted:
        if wanted in names:
            focus = f"action-{wanted}"
        elif wanted == "parse-workflow":
            focus, notice = "definition", "The action parse-workflow reads this whole definition: check its syntax."
        else:
            notice = f"This version of the workflow has no action {wanted[:60]!r}."
    return view.render("workflow.html", workflow=workflow, sections=sections, focus=focus, notice=notice,
                       wanted=wanted)


def routes(web: Web) -> list[Route]:
    return [
        Route("/", web.page(dashboard), methods=["GET"]),
        Route("/runs/{run_id}", web.page(run_page), methods=["GET"]),
        Route("/workflows/{workflow_id}", web.page(workflow_page), methods=["GET"]),
    ]

