"""Project variables. A secret variable's value never leaves this module: not in a list, not in a
get, not in a preview, not in the result of a set. Its values feed the scrubber instead."""

from __future__ import annotations

from typing import Any

from mcp_knecht.core import clock
from mcp_knecht.core.database import Database, Row
from mcp_knecht.errors import ConflictError, NotFoundError

HIDDEN = "(secret: the value is never shown)"


def shown(row: Row) -> dict[str, Any]:
    secret = bool(row["secret"])
    return {
        "name": row["name"],
        "secret": secret,
        "value": None if secret else row["value"],
        **({"note": HIDDEN} if secret else {}),
        "updated_at": row["updated_at"],
        "updated_by": row["updated_by"],
    }


async def secret_values(db: Database) -> set[str]:
    """Every secret variable's value, of every project: the literal values the scrubber masks."""
    rows = await db.fetch_all("SELECT value FROM project_variables WHERE secret = 1")
    return {row["value"] for row in rows if row["value"]}


async def list_variables(db: Database, project_id: int) -> list[dict[str, Any]]:
    rows = await db.fetch_all(
        "SELECT * FROM project_variables WHERE project_id = ? ORDER BY name", (project_id,)
    )
    return [shown(row) for row in rows]


async def get_variable(db: Database, project_id: int, name: str) -> Row | None:
    return await db.fetch_one(
        "SELECT * FROM project_variables WHERE project_id = ? AND name = ?", (project_id, name)
    )


async def require_variable(db: Database, project_id: int, slug: str, name: str) -> Row:
    row = await get_variable(db, project_id, name)
    if row is None:
        raise NotFoundError(
            f"Project {slug!r} has no variable {name!r}. project_variable with action 'list' shows its variables."
        )
    return row


def check_secrecy(existing: Row | None, secret: bool | None) -> bool:
    """The secrecy a set will store; a secret never silently becomes readable."""
    if existing is None:
        return bool(secret)
    if existing["secret"] and secret is False:
        raise ConflictError(
            f"{existing['name']} is secret and cannot be made non-secret (its value would become readable). "
            "Delete it and create a new non-secret variable instead."
        )
    return bool(existing["secret"]) if secret is None else secret


async def set_variable(
    db: Database, project_id: int, name: str, value: str, secret: bool | None, actor: str
) -> dict[str, Any]:
    now = clock.timestamp()
    async with db.transaction() as tx:
        existing = await tx.fetch_one(
            "SELECT * FROM project_variables WHERE project_id = ? AND name = ?", (project_id, name)
        )
        keep_secret = check_secrecy(existing, secret)
        if existing is None:
            await tx.execute(
                "INSERT INTO project_variables (project_id, name, value, secret, updated_at, updated_by)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (project_id, name, value, int(keep_secret), now, actor),
            )
        else:
            await tx.execute(
                "UPDATE project_variables SET value = ?, secret = ?, updated_at = ?, updated_by = ?"
                " WHERE project_id = ? AND name = ?",
                (value, int(keep_secret), now, actor, project_id, name),
            )
        row = await tx.fetch_one(
            "SELECT * FROM project_variables WHERE project_id = ? AND name = ?", (project_id, name)
        )
    assert row is not None
    return {"created": existing is None, "variable": shown(row)}


async def delete_variable(db: Database, project_id: int, name: str) -> dict[str, Any]:
    async with db.transaction() as tx:
        deleted = await tx.execute(
            "DELETE FROM project_variables WHERE project_id = ? AND name = ?", (project_id, name)
        )
    if deleted != 1:
        raise NotFoundError(f"Variable {name!r} does not exist (any more); nothing was deleted.")
    return {"deleted": name}
