"""The outbox in SQL: events written with the change they describe, fanned out to one delivery
row per destination, each claimed by exactly one worker at a time.

    proposals change ──same tx──▶ notify_outbox (routed_at NULL)
                                      │ route: one tx, rows locked (SKIP LOCKED on PostgreSQL)
                                      ▼
                        notify_deliveries: pending ──claim──▶ delivering ──▶ delivered
                                             ▲                    │ error: attempts < max
                                             └── next_attempt_at ─┘ error: attempts = max ──▶ failed

A claim is one conditional `UPDATE … RETURNING` that sets `claimed_by` and a lease: of any
number of workers (replicas) exactly one gets each row. A worker killed mid-delivery leaves
`delivering`; when its lease runs out the row is claimed again (at least once: a receiver that
must not act twice dedupes on the event's uid, the webhook's `webhook-id`). Outcomes are
recorded only by the claim holder (`WHERE claimed_by = ? AND status = 'delivering'`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any

import msgspec

from mcp_knecht.core import clock
from mcp_knecht.core.clock import timestamp
from mcp_knecht.core.database import Database, Row, Transaction, by_keys
from mcp_knecht.core.proposals import Proposal
from mcp_knecht.core.stored_json import json_object
from mcp_knecht.notify.events import EVENT_FOR_STATUS, snapshot
from mcp_knecht.store.written_around import as_text

ROUTE_BATCH = 200
NO_EVENT = "its event is no longer in the outbox (changed outside mcp-knecht)"

logger = logging.getLogger(__name__)


def _skip_locked(db: Database) -> str:
    """PostgreSQL's row locks let replicas pass each other by; SQLite's write transaction
    already holds the whole database."""
    return " FOR UPDATE SKIP LOCKED" if db.dialect == "postgresql" else ""


@asynccontextmanager
async def _bookkeeping(db: Database) -> AsyncIterator[Transaction]:
    """A transaction of the worker's own bookkeeping (routing, claims, outcomes), whose commit
    need not wait for the disk: lost in a database crash, it only means a delivery is made again
    (at least once). On PostgreSQL `synchronous_commit = off` spares the gate's own commits the
    queue behind these flushes; SQLite's WAL with synchronous=NORMAL does not flush per commit.
    The outbox rows themselves are written in the proposal's transaction, durable as it is."""
    async with db.transaction() as tx:
        if db.dialect == "postgresql":
            await tx.execute("SET LOCAL synchronous_commit TO OFF")
        yield tx


def later(seconds: float, now: datetime | None = None) -> str:
    return timestamp((now or clock.now()) + timedelta(seconds=seconds))


# --- writing: inside the proposal's own transaction ----------------------------------------------


class OutboxWriter:
    """The proposal repository's status hook: the event of a change, written in its transaction.

    Needs no channel configuration (the process deciding may be an operator's CLI that knows
    none): every event is written; the delivering server decides where it goes."""

    def __init__(self, scrub: Callable[[str], str]) -> None:
        self._scrub = scrub

    async def __call__(self, tx: Transaction, proposal: Proposal) -> None:
        event = EVENT_FOR_STATUS.get(proposal.status)
        if event is None:
            return
        await tx.execute_with_next(  # nothing reads it before the commit: it goes with the next statement
            "INSERT INTO notify_outbox (uid, event, proposal_id, payload_json, created_at) VALUES (?, ?, ?, ?, ?)",
            (f"evt_{uuid.uuid4().hex}", event, proposal.id, snapshot(proposal, event, self._scrub), timestamp()),
        )


# --- routing -------------------------------------------------------------------------------------

Router = Callable[[str, dict[str, Any]], Sequence[str]]
"""`router(event, facts) -> destination names`."""


def _facts(event: Row) -> dict[str, Any]:
    """An event's facts as stored. One written around the store that is no JSON object reads as
    `{"unreadable": …}`: it must not stop routing or claiming the events beside it, for good."""
    return json_object(event["payload_json"]) or {}


async def _route(tx: Transaction, db: Database, router: Router, limit: int) -> int:
    now = timestamp()
    events = await tx.fetch_all(
        f"SELECT id, event, payload_json FROM notify_outbox WHERE routed_at IS NULL ORDER BY id LIMIT ?"
        f"{_skip_locked(db)}", (limit,))
    if not events:
        return 0
    rows = [(event["id"], destination, now)
            for event in events for destination in router(event["event"], _facts(event))]
    await tx.execute_many(
        "INSERT INTO notify_deliveries (event_id, destination, status, attempts, next_attempt_at)"
        " VALUES (?, ?, 'pending', 0, ?) ON CONFLICT (event_id, destination) DO NOTHING", rows)
    ids = [event["id"] for event in events]
    await tx.execute(f"UPDATE notify_outbox SET routed_at = ? WHERE id IN ({', '.join('?' * len(ids))})",
                     (now, *ids))
    return len(events)


async def route(db: Database, router: Router, *, limit: int = ROUTE_BATCH) -> int:
    """Fan unrouted events out to their destinations; returns how many events were routed."""
    async with _bookkeeping(db) as tx:
        return await _route(tx, db, router, limit)


# --- claiming and recording ----------------------------------------------------------------------


class Claimed(msgspec.Struct, frozen=True):
    """A delivery this worker leased, to attempt now."""
    id: int
    destination: str
    attempts: int
    """Including this one."""
    uid: str
    event: str
    facts: dict[str, Any]
    created_at: str


_DUE = "((status = 'pending' AND next_attempt_at <= ?) OR (status = 'delivering' AND lease_until <= ?))"


async def _claim(tx: Transaction, db: Database, worker: str, lease: float, limit: int) -> list[Claimed]:
    now = timestamp()
    rows = await tx.fetch_all(
        "UPDATE notify_deliveries SET status = 'delivering', claimed_by = ?, lease_until = ?,"
        " attempts = attempts + 1"
        f" WHERE id IN (SELECT id FROM notify_deliveries WHERE {_DUE} ORDER BY next_attempt_at, id LIMIT ?"
        f"{_skip_locked(db)}) AND {_DUE}"
        " RETURNING id, event_id, destination, attempts",
        (worker, later(lease), now, now, limit, now, now),
    )
    if not rows:
        return []
    events = await _events_of(tx, db, rows)
    if gone := [row for row in rows if row["event_id"] not in events]:
        await _give_up_without_event(tx, gone)
        rows = [row for row in rows if row["event_id"] in events]
    return [Claimed(id=row["id"], destination=row["destination"], attempts=row["attempts"],
                    uid=events[row["event_id"]]["uid"], event=events[row["event_id"]]["event"],
                    facts=_facts(events[row["event_id"]]),
                    created_at=events[row["event_id"]]["created_at"])
            for row in sorted(rows, key=lambda r: r["id"])]


async def _events_of(tx: Transaction, db: Database, deliveries: list[Row]) -> dict[Any, Row]:
    # An event id written around the store as no integer matches no event (and must not fail the sort).
    ids = sorted({row["event_id"] for row in deliveries if type(row["event_id"]) is int})
    if not ids:
        return {}
    source, match, params = by_keys(db.dialect, "notify_outbox o", "o.id", ids)
    return {e["id"]: e for e in await tx.fetch_all(
        f"SELECT o.id, o.uid, o.event, o.payload_json, o.created_at FROM {source} WHERE {match}", params)}


async def _give_up_without_event(tx: Transaction, deliveries: list[Row]) -> None:
    """Deliveries whose event is gone (deleted, or their event id rewritten, around the store: SQLite's
    own shell does not enforce the foreign key) cannot be made. They fail for good here: left due, they
    would be claimed first in every round, and fail it, so no notification would go out again."""
    logger.warning("Notification deliveries %s name no event in the outbox (changed outside mcp-knecht); "
                   "they are given up", ", ".join(str(row["id"]) for row in deliveries))
    await tx.execute_many(
        "UPDATE notify_deliveries SET status = 'failed', lease_until = NULL, last_error = ? WHERE id = ?",
        [(NO_EVENT, row["id"]) for row in deliveries])


async def claim(db: Database, worker: str, *, lease: float, limit: int) -> list[Claimed]:
    """Up to `limit` due deliveries (new, retry due, or lease expired), now held by `worker`."""
    if limit <= 0:
        return []
    async with _bookkeeping(db) as tx:
        return await _claim(tx, db, worker, lease, limit)


async def take(db: Database, router: Router, worker: str, *, lease: float, limit: int,
               route_limit: int = ROUTE_BATCH) -> list[Claimed]:
    """`route` and `claim` in one transaction (the worker's round: one commit, not two)."""
    async with _bookkeeping(db) as tx:
        await _route(tx, db, router, route_limit)
        return await _claim(tx, db, worker, lease, limit) if limit > 0 else []


class Outcome(msgspec.Struct, frozen=True):
    """How one delivery attempt ended: delivered, retried later, or given up."""
    delivery_id: int
    error: str | None = None
    """None: delivered."""
    retry_in: float | None = None
    """After a failed attempt: seconds until the next, or None to give up (`failed`)."""


async def record(db: Database, worker: str, outcomes: Sequence[Outcome]) -> None:
    """Record attempts in one transaction; only rows `worker` still holds change."""
    now = clock.now()
    done = [(timestamp(now), o.delivery_id, worker) for o in outcomes if o.error is None]
    retry = [(later(o.retry_in, now), o.error, o.delivery_id, worker)
             for o in outcomes if o.error is not None and o.retry_in is not None]
    gave_up = [(o.error, o.delivery_id, worker) for o in outcomes if o.error is not None and o.retry_in is None]
    held = " WHERE id = ? AND claimed_by = ? AND status = 'delivering'"
    async with _bookkeeping(db) as tx:
        await tx.execute_many("UPDATE notify_deliveries SET status = 'delivered', delivered_at = ?,"
                              " lease_until = NULL, last_error = NULL" + held, done)
        await tx.execute_many("UPDATE notify_deliveries SET status = 'pending', next_attempt_at = ?,"
                              " lease_until = NULL, last_error = ?" + held, retry)
        await tx.execute_many("UPDATE notify_deliveries SET status = 'failed', lease_until = NULL,"
                              " last_error = ?" + held, gave_up)


async def holds(db: Database, delivery_id: int, worker: str) -> bool:
    """Does `worker` still hold this delivery (its claim not taken over after its lease ran out)?"""
    row = await db.fetch_one("SELECT 1 AS held FROM notify_deliveries WHERE id = ? AND claimed_by = ?"
                             " AND status = 'delivering'", (delivery_id, worker))
    return row is not None


async def release(db: Database, worker: str) -> int:
    """Hand back what `worker` still holds (a clean shutdown): due again at once, elsewhere too."""
    async with _bookkeeping(db) as tx:
        return await tx.execute(
            "UPDATE notify_deliveries SET status = 'pending', lease_until = NULL, next_attempt_at = ?,"
            " attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END"
            " WHERE claimed_by = ? AND status = 'delivering'", (timestamp(), worker))


# --- looking -------------------------------------------------------------------------------------


class Due(msgspec.Struct, frozen=True):
    """Whether the outbox has work now, and else when it next will."""
    now: bool
    """Something is unrouted, or a delivery is due (new, retry, or a lease that ran out)."""
    next_at: str | None
    """When the earliest waiting retry or held lease falls due (None: nothing waits)."""


async def due(db: Database) -> Due:
    """A cheap read (no write lock): is there work now, and when is the next?"""
    row = await db.fetch_one(
        "SELECT EXISTS (SELECT 1 FROM notify_outbox WHERE routed_at IS NULL) AS unrouted,"
        " (SELECT MIN(next_attempt_at) FROM notify_deliveries WHERE status = 'pending') AS retry,"
        " (SELECT MIN(lease_until) FROM notify_deliveries WHERE status = 'delivering') AS lease")
    if row is None:
        return Due(False, None)
    # `stored`: a moment written around the store as bytes would fail the comparison at every round.
    waiting = [clock.stored(at) for at in (row["retry"], row["lease"]) if at is not None]
    next_at = min(waiting) if waiting else None
    return Due(bool(row["unrouted"]) or (next_at is not None and next_at <= timestamp()), next_at)


async def purge(db: Database, *, older_than: float) -> int:
    """Forget events routed longer ago than `older_than` seconds whose deliveries are all settled."""
    async with _bookkeeping(db) as tx:
        return await tx.execute(
            "DELETE FROM notify_outbox WHERE routed_at IS NOT NULL AND routed_at < ? AND NOT EXISTS"
            " (SELECT 1 FROM notify_deliveries d WHERE d.event_id = notify_outbox.id"
            "  AND d.status IN ('pending', 'delivering'))", (later(-older_than),))


class OutboxStatus(msgspec.Struct, frozen=True):
    """The outbox at a glance, for `mcp-knecht notify status`."""
    unrouted: int
    counts: list[Row]
    """`destination, status, n` for every pair that has rows."""
    problems: list[Row]
    """Deliveries that failed for good or are retrying: newest first, with the last error."""
    oldest_waiting: str | None

    def as_json(self) -> dict[str, Any]:
        return {"unrouted_events": self.unrouted, "deliveries": self.counts, "problems": self.problems,
                "oldest_waiting_since": self.oldest_waiting}


async def status(db: Database, *, limit: int = 20) -> OutboxStatus:
    unrouted = await db.fetch_one("SELECT COUNT(*) AS n FROM notify_outbox WHERE routed_at IS NULL")
    counts = await db.fetch_all(
        "SELECT destination, status, COUNT(*) AS n FROM notify_deliveries GROUP BY destination, status"
        " ORDER BY destination, status")
    problems = await db.fetch_all(
        "SELECT d.id, d.destination, d.status, d.attempts, d.next_attempt_at, d.last_error, o.event,"
        " o.proposal_id, o.created_at FROM notify_deliveries d JOIN notify_outbox o ON o.id = d.event_id"
        " WHERE d.status = 'failed' OR (d.status IN ('pending', 'delivering') AND d.attempts > 0)"
        " ORDER BY d.id DESC LIMIT ?", (limit,))
    oldest = await db.fetch_one(
        "SELECT MIN(o.created_at) AS at FROM notify_deliveries d JOIN notify_outbox o ON o.id = d.event_id"
        " WHERE d.status IN ('pending', 'delivering')")
    # `as_text`: a value written around the store as bytes is shown, and fails no `--json`.
    return OutboxStatus(unrouted=int(unrouted["n"]) if unrouted else 0,
                        counts=[{**as_text(row), "n": int(row["n"])} for row in counts],
                        problems=[as_text(row) for row in problems],
                        oldest_waiting=as_text(oldest)["at"] if oldest else None)
