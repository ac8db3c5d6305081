"""The AI layer of a running server: settings, models, the loop over the app's gate, the record of
every feature run, the diagnosis service and its background worker.

    runtime = AiRuntime.create(load_ai_settings(env, config_dir), gate=gate, db=db, secrets=secrets)
    result = await runtime.run_feature(FAILURE_DIAGNOSIS, "Run 7 failed. Why?", actor)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(runtime.run)          # the worker, when a model is configured and it is on
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import anyio
import anyio.abc
from msgspec.structs import replace

from mcp_knecht.ai.diagnosis import FAILURE_DIAGNOSIS, DiagnosisService
from mcp_knecht.ai.errors import FeatureError, FeatureUnavailable
from mcp_knecht.ai.feature import Feature, FeatureResult, Output
from mcp_knecht.ai.models import ModelResolver
from mcp_knecht.ai.records import record_feature_run
from mcp_knecht.ai.settings import AiSettings
from mcp_knecht.ai.worker import DiagnosisWorker
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.clock import timestamp
from mcp_knecht.core.database import Database
from mcp_knecht.core.gate import Gate
from mcp_knecht.core.scrub import SecretRegistry


class AiRuntime:
    def __init__(self, settings: AiSettings, *, gate: Gate, db: Database,
                 scrub: Callable[[str], str] = lambda text: text, models: ModelResolver | None = None,
                 worker_options: Mapping[str, Any] | None = None) -> None:
        self.settings = settings
        self.gate = gate
        self.db = db
        self.scrub = scrub
        self.models = models or ModelResolver(settings)
        self.instance = f"{socket.gethostname()}:{os.getpid()}"
        self.diagnoses = DiagnosisService(self)
        self.worker = DiagnosisWorker(self.diagnoses, db, **dict(worker_options or {}))
        self._tasks: anyio.abc.TaskGroup | None = None

    @classmethod
    def create(cls, settings: AiSettings, *, gate: Gate, db: Database,
               secrets: SecretRegistry | None = None) -> AiRuntime:
        """Over a server's gate and store; the API keys join the output scrubber."""
        if secrets is not None:
            secrets.add(settings.secret_values())
        return cls(settings, gate=gate, db=db, scrub=secrets if secrets is not None else (lambda text: text))

    @property
    def serves_diagnosis(self) -> bool:
        """True when the gate serves the failure diagnosis's tools (the Knecht toolset is loaded)."""
        return all(name in self.gate.registry for name in FAILURE_DIAGNOSIS.tools)

    async def run_feature(self, feature: Feature[Output], prompt: str, actor: Actor) -> FeatureResult[Output]:
        """`runAiFeature`: the feature's model role, the loop over the gate, and a record of the run."""
        started = timestamp()
        model_name: str | None = None
        try:
            resolved = self.models.resolve(feature.role)
            model_name = resolved.name
            from mcp_knecht.ai.loop import run_feature  # pydantic-ai loads only when a feature runs

            result = await run_feature(feature, prompt, actor, gate=self.gate, model=resolved.model,
                                       model_name=resolved.name, settings=resolved.settings,
                                       timeout=resolved.timeout, scrub=self.scrub)
        except FeatureError as exc:
            status = "unavailable" if isinstance(exc, FeatureUnavailable) else "failed"
            with anyio.CancelScope(shield=True):
                exc.details["feature_run"] = await record_feature_run(
                    self.db, feature=feature.id, actor=actor, model=model_name, status=status, error=exc.message,
                    started_at=started, finished_at=timestamp())
            raise
        record = await record_feature_run(self.db, feature=feature.id, actor=actor, model=model_name, status="done",
                                          result=result, started_at=started, finished_at=timestamp())
        return replace(result, record_id=record)

    def start_soon(self, function: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> bool:
        """Run in the background of a running runtime; False when it is not running (a CLI)."""
        if self._tasks is None:
            return False
        self._tasks.start_soon(function, *args)
        return True

    async def run(self, *, auto_diagnose: bool = True) -> None:
        """Background work until cancelled: on-demand requests, and the worker when it is on."""
        try:
            async with anyio.create_task_group() as tasks:
                self._tasks = tasks
                if auto_diagnose and self.settings.auto_diagnose_on and self.serves_diagnosis:
                    tasks.start_soon(self.worker.run)
                await anyio.sleep_forever()
        finally:
            self._tasks = None

    async def aclose(self) -> None:
        """Release the providers' HTTP clients (at shutdown)."""
        with anyio.CancelScope(shield=True):
            await self.models.aclose()


