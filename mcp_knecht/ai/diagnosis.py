"""The failure diagnosis (feature `failure-diagnosis`, seed 002): why a run failed, in one or two
sentences, and the actions whose logs show it.

`DiagnosisService` runs it for one run and stores the outcome (`diagnoses.py`): on demand
(`mcp-knecht diagnose`, `GET /api/runs/{id}/diagnosis`) and for the background worker
(`worker.py`), always behind a claim, so each run is diagnosed once however many ask.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import anyio
from pydantic import BaseModel, Field

from mcp_knecht.ai import diagnoses
from mcp_knecht.ai.errors import FeatureError, FeatureUnavailable
from mcp_knecht.ai.feature import Feature, FeatureResult, Output
from mcp_knecht.ai.models import ModelResolver
from mcp_knecht.ai.tables import DIAGNOSIS_TOOLS
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.clock import timestamp
from mcp_knecht.core.database import Database
from mcp_knecht.errors import ConflictError, NotFoundError


class Runtime(Protocol):
    """What the service uses of `AiRuntime` (declared here, so that the two modules need not import
    each other)."""

    db: Database
    instance: str
    models: ModelResolver
    scrub: Callable[[str], str]

    @property
    def serves_diagnosis(self) -> bool: ...

    async def run_feature(self, feature: Feature[Output], prompt: str, actor: Actor) -> FeatureResult[Output]: ...

    def start_soon(self, function: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> bool: ...

logger = logging.getLogger(__name__)

LEASE = timedelta(minutes=15)
"""How long a claim holds before another worker may take the run over (far beyond a feature run's
step limit times the model timeout)."""

DIAGNOSIS_SCOPES = frozenset({"runs:read", "logs:read", "workflows:read"})
WORKER_ACTOR = Actor(subject="knecht-diagnosis", client="mcp-knecht", scopes=DIAGNOSIS_SCOPES)
"""Who the automatic diagnosis acts as: it reads runs, logs and workflows, and nothing else."""


class DiagnosisOutput(BaseModel):
    summary: str = Field(
        min_length=1, max_length=1000,
        description="One or two sentences: the cause of the failure and the most likely fix.",
    )
    actionIds: list[int] = Field(
        default_factory=list, max_length=20,
        description="The ids of the actions whose logs show the cause (from get_run's `actions`).",
    )


FAILURE_DIAGNOSIS = Feature(
    id="failure-diagnosis",
    role="fast",
    instructions=(
        "You explain why a run of Knecht CI failed. Read the run (get_run): `failed_action` names the action "
        "that failed. Read its log first (get_action_log with tail). If the cause is not there - the process was "
        "killed, or the log only shows a symptom - read earlier actions' logs (tail, or grep for 'warning', "
        "'error', 'memory') or the run's own log (get_run_log). Read the workflow (get_workflow with the run's "
        "workflow id and version) when the cause may be in the definition: invalid YAML, a timeout, a missing "
        "cache. Stop as soon as you know the cause. Answer with one or two plain sentences: the cause and the "
        "most likely fix; and the ids of the actions whose logs show the cause. Never quote secrets."
    ),
    tools=DIAGNOSIS_TOOLS,
    output=DiagnosisOutput,
    max_steps=4,
)


def diagnosis_prompt(run_id: int) -> str:
    return f"Run {run_id} failed. Why, and what is the most likely fix?"


def _now() -> str:
    return timestamp()


class DiagnosisService:
    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._db = runtime.db

    def new_owner(self) -> str:
        return f"{self._runtime.instance}:{uuid.uuid4().hex[:8]}"

    async def _failed_run(self, run_id: int) -> list[int]:
        """The run's action ids; refuses runs that do not exist or did not fail."""
        if not self._runtime.serves_diagnosis:
            raise NotFoundError("This server serves no CI runs (the Knecht toolset is not loaded).")
        run = await self._db.fetch_one("SELECT status FROM runs WHERE id = ?", (run_id,))
        if run is None:
            raise NotFoundError(f"Run {run_id} does not exist.")
        if run["status"] != "failed":
            raise ConflictError(f"Run {run_id} is {run['status']}, not failed: there is nothing to diagnose.",
                                details={"run_id": run_id, "run_status": run["status"]})
        rows = await self._db.fetch_all("SELECT id FROM actions WHERE run_id = ?", (run_id,))
        return [int(row["id"]) for row in rows]

    async def stored(self, run_id: int) -> dict[str, Any] | None:
        return await diagnoses.shown_diagnosis(self._db, run_id)

    async def request(self, run_id: int, actor: Actor, *, again: bool = False,
                      wait: bool = True) -> dict[str, Any]:
        """The run's diagnosis: the stored one, or a new one made now (`wait`) or in the background.

        `unavailable` when no model is configured; `pending` while another worker is at it."""
        await self._failed_run(run_id)
        stored = await diagnoses.get_diagnosis(self._db, run_id)
        if stored is not None and stored.status == "done" and not again:
            return stored.shown()
        try:
            self._runtime.models.resolve(FAILURE_DIAGNOSIS.role)
        except FeatureUnavailable as exc:
            await diagnoses.store_unavailable(self._db, run_id, exc.message, now=_now())
            return {"status": "unavailable", "error": exc.message}
        owner = self.new_owner()
        retake = ("unavailable", "failed", "done") if again else ("unavailable", "failed")
        if not await self.claim(run_id, owner, retake=retake):
            current = await diagnoses.get_diagnosis(self._db, run_id)
            return current.shown() if current else {"status": "pending", "summary": diagnoses.PENDING_TEXT}
        if not wait and self._runtime.start_soon(self.run_claimed, run_id, actor, owner):
            return {"status": "pending", "summary": diagnoses.PENDING_TEXT}
        return await self.run_claimed(run_id, actor, owner)

    async def claim(self, run_id: int, owner: str, *, retake: tuple[str, ...] = ("unavailable",)) -> bool:
        now = datetime.now(UTC)
        return await diagnoses.claim(self._db, run_id, owner, now=timestamp(now),
                                     lease_until=timestamp(now + LEASE), retake=retake)

    async def run_claimed(self, run_id: int, actor: Actor, owner: str) -> dict[str, Any]:
        """Diagnose a run this owner has claimed, and store the outcome."""
        try:
            action_ids = await self._failed_run(run_id)
            result = await self._runtime.run_feature(FAILURE_DIAGNOSIS, diagnosis_prompt(run_id), actor)
        except FeatureError as exc:
            status = "unavailable" if isinstance(exc, FeatureUnavailable) else "failed"
            await diagnoses.finish(self._db, run_id, owner, status=status, error=exc.message, now=_now(),
                                   feature_run=exc.details.get("feature_run"))
            return {"status": status, "error": exc.message}
        except ConflictError as exc:  # the run was re-run or changed meanwhile
            await diagnoses.finish(self._db, run_id, owner, status="failed", error=exc.message, now=_now())
            return {"status": "failed", "error": exc.message}
        except anyio.get_cancelled_exc_class():
            # Shutdown: hand the claim back, so the next worker (a restart, a replica) takes it at once.
            with anyio.CancelScope(shield=True):
                try:
                    await diagnoses.release(self._db, run_id, owner, now=_now())
                except Exception:  # the lease runs out by itself
                    logger.exception("Could not release the diagnosis claim of run %s", run_id)
            raise
        except Exception:
            reference = uuid.uuid4().hex[:12]
            logger.exception("Diagnosis of run %s failed (reference %s)", run_id, reference)
            message = f"Internal error while diagnosing (reference {reference}); the server log has details."
            await diagnoses.finish(self._db, run_id, owner, status="failed", error=message, now=_now())
            return {"status": "failed", "error": message}
        known = set(action_ids)
        shown_ids = [i for i in dict.fromkeys(result.output.actionIds) if i in known]
        summary = self._runtime.scrub(result.output.summary.strip())
        await diagnoses.finish(self._db, run_id, owner, status="done", summary=summary, action_ids=shown_ids,
                               model=result.model, feature_run=result.record_id, now=_now())
        return {"status": "done", "summary": summary, "actionIds": shown_ids, "model": result.model}
