"""The run generator: runs, their actions and their logs, from the catalogue and one random
generator, so that a seed always yields the same runs."""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta

from mcp_knecht.knecht.demo.catalogue import ACTION_SECONDS, WORKFLOW_ACTIONS, WORKFLOW_INPUTS, _Project
from mcp_knecht.knecht.demo.common import (
    FAILING_ACTION,
    FAILURE_KINDS,
    FAILURE_WEIGHTS,
    SCHEDULER,
    SPAN,
    USERS,
    _iso,
    _sha,
)
from mcp_knecht.knecht.demo.logs import _action_log
from mcp_knecht.knecht.demo.writer import _Writer


class _RunGenerator:
    def __init__(
        self, rng: random.Random, projects: list[_Project], total: int, writer: _Writer, *, start: datetime,
        now: datetime, with_logs: bool = True,
    ) -> None:
        self.with_logs = with_logs
        self.start = start
        self.now = now.replace(second=0, microsecond=0)
        self.rng = rng
        self.projects = projects
        self.total = total
        self.writer = writer
        self.weights = [p.spec.weight for p in projects]
        self.numbers: dict[int, int] = {}
        self.recent_failed: dict[
            int, list[tuple[int, str, str, str]]
        ] = {}  # workflow -> (id, branch, sha, kind)
        self.examples: dict[str, int] = {}
        self.failed = 0
        self.action_id = 0
        self.log_lines = 0
        self.failures_seen = 0

    async def generate(self) -> None:
        step = SPAN.total_seconds() / max(self.total, 1)
        # The newest runs are still in flight: a few running, then a few queued at the very end.
        in_flight = min(6, self.total // 40)
        for run_id in range(1, self.total + 1):
            queued = self.start + timedelta(seconds=int((run_id - 1) * step + self.rng.random() * step))
            from_end = self.total - run_id
            if from_end < in_flight // 2:
                status = "queued"
                queued = self.now - timedelta(minutes=2 * from_end + 1)  # waiting for a runner since
            elif from_end < in_flight:
                status = "running"
            else:
                status = None
            self._run(run_id, queued, status)
            if self.writer.full:
                await self.writer.flush()

    def _pick_kind(self) -> str:
        # The first failures cycle through every kind, so even a small demo shows each of them.
        kind = (
            FAILURE_KINDS[self.failures_seen]
            if self.failures_seen < len(FAILURE_KINDS)
            else self.rng.choices(FAILURE_KINDS, FAILURE_WEIGHTS)[0]
        )
        self.failures_seen += 1
        return kind

    def _run(self, run_id: int, queued: datetime, forced_status: str | None) -> None:
        rng = self.rng
        project = rng.choices(self.projects, self.weights)[0]
        workflow = rng.choices(("ci", "release", "nightly"), (78, 8, 14))[0]
        workflow_id = project.workflows[workflow]
        rerun_of: int | None = None
        kind: str | None = None
        candidates = self.recent_failed.get(workflow_id)
        if workflow == "nightly":
            trigger, branch, actor = "schedule", "main", SCHEDULER
        elif candidates and rng.random() < 0.25:
            trigger, actor = "rerun", rng.choice(USERS)
            rerun_of, branch, sha, previous_kind = candidates.pop(rng.randrange(len(candidates)))
        elif workflow == "release":
            trigger, branch, actor = rng.choice(("manual", "push")), "main", rng.choice(USERS)
        else:
            trigger = rng.choices(("push", "pull_request", "manual"), (58, 38, 4))[0]
            feature = [name for name, _ in project.branches if name != "main"]
            branch = "main" if trigger == "push" and rng.random() < 0.45 else rng.choice(feature)
            actor = rng.choice(USERS)
        if rerun_of is None:
            sha = dict(project.branches)[branch] if rng.random() < 0.2 else _sha(rng)
        # A rerun of a flaky failure usually passes; a rerun of a real bug usually fails the same way.
        if forced_status:
            status = forced_status
        elif rerun_of is not None:
            repeat = 0.15 if previous_kind in ("flaky_network", "timeout") else 0.5
            status = "failed" if rng.random() < repeat else "succeeded"
            kind = previous_kind if status == "failed" else None
        else:
            roll = rng.random()
            status = "failed" if roll < 0.16 else "cancelled" if roll < 0.21 else "succeeded"
        if status == "failed" and kind is None:
            kind = self._pick_kind()
        if status == "failed":
            assert kind is not None
            self.failed += 1
            self.examples.setdefault(kind, run_id)
            self.recent_failed.setdefault(workflow_id, []).append((run_id, branch, sha, kind))
            del self.recent_failed[workflow_id][:-5]

        version = sum(1 for stamp in project.versions[workflow_id] if stamp <= queued) or 1
        self.numbers[workflow_id] = number = self.numbers.get(workflow_id, 0) + 1
        inputs = {key: spec["default"] for key, spec in WORKFLOW_INPUTS[workflow].items()}
        if workflow == "release":
            inputs["version"] = f"v{rng.randint(1, 3)}.{number // 4}.{number % 4}"
            inputs["environment"] = (
                "production" if trigger == "push" else rng.choice(("staging", "production"))
            )
        elif trigger == "manual" and workflow == "ci":
            inputs["run_slow_tests"] = True

        started = None if status == "queued" else queued + timedelta(seconds=rng.randint(2, 90))
        finished, run_log = self._actions(run_id, project, workflow, status, kind, started, sha, branch)
        header = [
            f"{_iso(queued)} Run #{number} of {workflow} (version {version}) queued by {actor} via {trigger}"
            + (f" (rerun of run {rerun_of})" if rerun_of else ""),
            f"{_iso(queued)} Repository {project.spec.slug} @ {branch} ({sha[:12]})",
        ]
        if started is None:
            header.append(f"{_iso(queued)} Waiting for a runner (3 jobs ahead in queue linux-x64)")
        else:
            header.append(f"{_iso(started)} Picked up by runner knecht-runner-{rng.randint(1, 12):02d}")
            header.append(f"{_iso(started)} Inputs: {json.dumps(inputs, sort_keys=True)}")
        self._log(run_id, 0, header + run_log)
        self.writer.add(
            "runs",
            (
                run_id,
                project.id,
                workflow_id,
                version,
                number,
                status,
                trigger,
                branch,
                sha,
                json.dumps(inputs, sort_keys=True),
                actor,
                _iso(queued),
                _iso(started) if started else None,
                _iso(finished) if finished else None,
                rerun_of,
            ),
        )

    def _actions(
        self,
        run_id: int,
        project: _Project,
        workflow: str,
        status: str,
        kind: str | None,
        started: datetime | None,
        sha: str,
        branch: str,
    ) -> tuple[datetime | None, list[str]]:
        """Write the actions of one run; returns the run's finish time and its own log lines."""
        rng = self.rng
        names = WORKFLOW_ACTIONS[workflow]
        stop_at = len(names)  # index of the action where the run stops (fails, is cancelled or runs)
        if status == "failed":
            assert kind is not None
            stop_at = names.index(FAILING_ACTION[kind])
        elif status in ("cancelled", "running"):
            stop_at = rng.randrange(1, len(names))
        elif status == "queued":
            stop_at = -1
        clock = started
        run_log: list[str] = []
        for position, name in enumerate(names, start=1):
            self.action_id += 1
            action_id = self.action_id
            index = position - 1
            if status == "queued" or index > stop_at:
                state = "skipped" if status in ("failed", "cancelled") else "pending"
                self.writer.add("actions", (action_id, run_id, position, name, state, None, None, None))
                continue
            assert clock is not None
            low, high = ACTION_SECONDS[name]
            seconds = rng.randint(low, high)
            outcome = "succeeded"
            exit_code: int | None = 0
            if index == stop_at and status != "succeeded":
                outcome = {"failed": "failed", "cancelled": "cancelled", "running": "running"}[status]
                exit_code = None
                if status == "failed":
                    assert kind is not None
                    exit_code = {"timeout": 124, "out_of_memory": 137}.get(kind, 1)
                    if kind == "timeout":
                        seconds = 20 * 60
            begin = clock
            end = begin + timedelta(seconds=seconds)
            lines = _action_log(rng, project, name, outcome, kind, sha, branch, workflow)
            self._log(run_id, action_id, lines)
            run_log.append(f"{_iso(begin)} ▶ {name} started")
            if outcome == "running":
                self.writer.add(
                    "actions", (action_id, run_id, position, name, "running", None, _iso(begin), None)
                )
                continue
            run_log.append(
                f"{_iso(end)} {'✔' if outcome == 'succeeded' else '✖'} {name} {outcome} in {seconds}s"
                + (f" (exit code {exit_code})" if exit_code else "")
            )
            self.writer.add(
                "actions", (action_id, run_id, position, name, outcome, exit_code, _iso(begin), _iso(end))
            )
            clock = end + timedelta(seconds=rng.randint(0, 3))
        if status in ("queued", "running"):
            return None, run_log
        assert clock is not None
        if status == "failed":
            failed_name = names[stop_at]
            run_log.append(
                f"{_iso(clock)} Run failed: action '{failed_name}' failed; remaining actions skipped"
            )
        elif status == "cancelled":
            run_log.append(f"{_iso(clock)} Run cancelled by {rng.choice(USERS)}; remaining actions skipped")
        else:
            run_log.append(f"{_iso(clock)} Run succeeded")
        return clock, run_log

    def _log(self, run_id: int, action_id: int, lines: list[str]) -> None:
        if not self.with_logs:
            return
        for line_no, text in enumerate(lines, start=1):
            self.writer.add("log_lines", (run_id, action_id, line_no, text))
        self.log_lines += len(lines)
