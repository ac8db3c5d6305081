"""Plain-text rendering shared by the CLIs: tables, proposals, diffs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from mcp_knecht.core.proposals import Proposal


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers], *[["" if v is None else str(v) for v in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(value.ljust(widths[i]) for i, value in enumerate(row)).rstrip() for row in cells]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def proposal_row(p: Proposal) -> list[object]:
    return [p.id, p.status, p.call_name, p.proposer_subject, p.created_at[:19], p.expires_at[:19],
            p.arguments_hash[:12], p.decided_by or "", p.quorum]


PROPOSAL_HEADERS = ["ID", "STATUS", "CALL", "PROPOSER", "CREATED (UTC)", "EXPIRES (UTC)", "HASH", "DECIDED BY",
                    "APPROVALS"]


def _diffs(arguments: dict[str, Any], preview: dict[str, Any] | None) -> list[str]:
    """A unified diff for every multi-line text the call would replace (a definition, say)."""
    if not preview:
        return []
    import difflib  # only for a proposal's details: not on every start's path

    out = []
    for key, new in arguments.items():
        old = preview.get(key)
        if isinstance(new, str) and isinstance(old, str) and old != new and ("\n" in new or "\n" in old):
            diff = difflib.unified_diff(
                old.splitlines(keepends=True), new.splitlines(keepends=True),
                fromfile=f"{key} (current)", tofile=f"{key} (proposed)",
            )
            out.append("".join(diff))
    return out


def proposal_details(p: Proposal) -> str:
    lines = [
        f"Proposal #{p.id}: {p.call_name}",
        f"  status      {p.shown_status}",
        f"  proposer    {p.proposer_subject} (client {p.proposer_client})",
        f"  scopes      {' '.join(p.proposer_scopes)}",
        f"  policy rule {p.rule}",
        *([f"  why staged  {p.policy_reason}"] if p.policy_reason else []),
        f"  approvals   {p.quorum}",
        f"  created     {p.created_at}",
        f"  expires     {p.expires_at}",
        f"  hash        {p.arguments_hash}",
    ]
    if p.decided_by:
        lines.append(f"  decided     by {p.decided_by} at {p.decided_at}")
    if p.reason:
        lines.append(f"  reason      {p.reason}")
    lines += ["", "Arguments (secrets masked; the hash covers the exact values):" if p.arguments_shown
              and p.arguments_shown != p.arguments_json else "Arguments:",
              json.dumps(p.shown_arguments, indent=2, ensure_ascii=False, sort_keys=True)]
    if p.preview is not None:
        lines += ["", "Current state (preview):", json.dumps(p.preview, indent=2, ensure_ascii=False)]
    for diff in _diffs(p.shown_arguments, p.preview):
        lines += ["", "Change:", diff.rstrip("\n")]
    if p.result is not None:
        lines += ["", "Result:", json.dumps(p.result, indent=2, ensure_ascii=False)]
    if p.error:
        lines += ["", f"Error: {p.error}"]
    return "\n".join(lines)


def proposal_json(p: Proposal) -> dict[str, Any]:
    return p.document()
