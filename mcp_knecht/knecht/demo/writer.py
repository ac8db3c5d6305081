"""Batched writing of the generated rows: one transaction per flush, bounded memory."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mcp_knecht.core.database import Database
from mcp_knecht.knecht.demo.common import BATCH_ROWS


class _Writer:
    """Buffers rows per table; flushes all tables together, parents first, when one is full."""

    TABLES = {
        "runs": "INSERT INTO runs (id, project_id, workflow_id, workflow_version, number, status, trigger,"
        " branch, commit_sha, inputs_json, created_by, queued_at, started_at, finished_at, rerun_of)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        "actions": "INSERT INTO actions (id, run_id, position, name, status, exit_code, started_at,"
        " finished_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        "log_lines": "INSERT INTO log_lines (run_id, action_id, line_no, text) VALUES (?, ?, ?, ?)",
    }

    def __init__(self, db: Database, progress: Callable[[str], None] | None, total_runs: int) -> None:
        self.db = db
        self.progress = progress
        self.total_runs = total_runs
        self.buffers: dict[str, list[Sequence[Any]]] = {table: [] for table in self.TABLES}
        self.runs_written = 0

    def add(self, table: str, row: Sequence[Any]) -> None:
        self.buffers[table].append(row)

    @property
    def full(self) -> bool:
        return any(len(rows) >= BATCH_ROWS for rows in self.buffers.values())

    async def flush(self) -> None:
        if not any(self.buffers.values()):
            return
        async with self.db.transaction() as tx:
            for table, sql in self.TABLES.items():
                rows = self.buffers[table]
                for start in range(0, len(rows), BATCH_ROWS):
                    await tx.execute_many(sql, rows[start : start + BATCH_ROWS])
        self.runs_written += len(self.buffers["runs"])
        self.buffers = {table: [] for table in self.TABLES}
        if self.progress:
            self.progress(f"{self.runs_written}/{self.total_runs} runs written")
