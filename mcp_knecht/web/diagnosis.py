"""The failure diagnosis on a status card (seed 002): where the page gets it, and how it shows it.

    diagnosis = await run_diagnosis(app, actor, run_id)      # the one hook: a dict of the API's shape
    card = DiagnosisCard.of(diagnosis, run)                  # what the template renders

The dict has the shape of `GET /api/runs/{id}/diagnosis`:
`{"status": "pending"|"done"|"failed"|"unavailable", "summary"?, "actionIds"?, "model"?, "error"?}`.
`run_diagnosis` is the only place the web asks for one: the AI features' stored diagnosis
(`app.ai.diagnoses`, the same as the route's), which starts one in the background for a failed run
that has none. The card's four states are rendered from such dicts alone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

import msgspec

from mcp_knecht.app import App
from mcp_knecht.core.actor import Actor
from mcp_knecht.errors import ConflictError, NotFoundError

DIAGNOSIS_SCOPES = ("runs:read", "logs:read")
"""What reading a diagnosis needs (the route's scopes): it quotes the run's logs."""
PENDING_TEXT = "Knecht is looking into why the last run failed."
STATES = ("pending", "done", "failed", "unavailable")

DiagnosisSource = Callable[[Actor, int], Awaitable[dict[str, Any] | None]]
"""`async (actor, run_id) -> diagnosis dict | None`: what the pages ask (injectable for tests)."""


async def run_diagnosis(app: App, actor: Actor, run_id: int) -> dict[str, Any] | None:
    """THE HOOK: the diagnosis of failed run `run_id` as `actor` may see it; None when the actor may not
    read diagnoses, or the run has none to show (the card then shows none)."""
    if not all(actor.holds(scope) for scope in DIAGNOSIS_SCOPES):
        return None
    try:
        shown: dict[str, Any] = await app.ai.diagnoses.request(run_id, actor, wait=False)
    except (NotFoundError, ConflictError):  # no such run, or it did not fail
        return None
    return shown


def diagnosis_source(app: App) -> DiagnosisSource:
    async def source(actor: Actor, run_id: int) -> dict[str, Any] | None:
        return await run_diagnosis(app, actor, run_id)

    return source


class ActionButton(msgspec.Struct, frozen=True):
    label: str
    href: str


class DiagnosisCard(msgspec.Struct, frozen=True):
    state: str
    """One of `STATES`."""
    text: str
    buttons: tuple[ActionButton, ...] = ()
    model: str | None = None
    detail: str | None = None
    """Why there is none (`failed`, `unavailable`): the error, as the diagnosis gave it."""

    @property
    def final(self) -> bool:
        """Nothing more will come without a new run: the page stops asking."""
        return self.state != "pending"

    @classmethod
    def of(cls, diagnosis: dict[str, Any] | None, run: dict[str, Any] | None = None) -> DiagnosisCard | None:
        """The card for a diagnosis dict; `run` (get_run's result) names the actions behind `actionIds`."""
        if diagnosis is None:
            return None
        state = diagnosis.get("status")
        if state == "pending":
            return cls("pending", PENDING_TEXT)
        if state == "done":
            summary = str(diagnosis.get("summary") or "").strip() or "The diagnosis came back without a summary."
            ids = [i for i in diagnosis.get("actionIds") or [] if isinstance(i, int) and not isinstance(i, bool)]
            model = diagnosis.get("model")
            return cls("done", summary, tuple(_button(i, run) for i in dict.fromkeys(ids)),
                       str(model) if model else None)
        error = str(diagnosis.get("error") or "").strip() or None
        if state == "failed":
            return cls("failed", "Knecht could not work out why this run failed.", detail=error)
        return cls("unavailable", "No diagnosis is available for this run.", detail=error)


def _button(action_id: int, run: dict[str, Any] | None) -> ActionButton:
    """A button per action: opens that action in its workflow's definition, expanded."""
    actions = {a.get("id"): a for a in (run or {}).get("actions") or []}
    action = actions.get(action_id)
    if run is None or action is None or not run.get("workflow_id"):
        run_part = f"/runs/{run['id']}?action={action_id}" if run and run.get("id") else "#"
        return ActionButton(f"Action #{action_id}", run_part)
    name = quote(str(action["name"]), safe="")
    return ActionButton(str(action["name"]), f"/workflows/{run['workflow_id']}?action={name}#action-{name}")
