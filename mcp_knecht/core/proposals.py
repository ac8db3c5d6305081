"""Proposals: frozen calls, and the repository interface the store implements for them.

A proposal's status as every reader sees it is *effective*: a pending proposal whose expiry has
passed reads as `expired` on every path (get, list, statuses), whether or not a sweep has written
that yet. The repository (`mcp_knecht.store.proposals`) is the one place rows become proposals.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal, Protocol

import msgspec

from mcp_knecht.core.actor import Actor
from mcp_knecht.core.audit import AuditEntry
from mcp_knecht.core.canonical import canonical_json
from mcp_knecht.core.stored_json import json_object

Status = Literal["pending", "approved", "executing", "succeeded", "failed", "rejected", "expired"]
STATUSES: tuple[Status, ...] = ("pending", "approved", "executing", "succeeded", "failed", "rejected", "expired")
OPEN: frozenset[str] = frozenset({"pending", "approved", "executing"})
DECIDED: frozenset[str] = frozenset({"succeeded", "failed", "rejected", "expired"})
QuorumOutcome = Literal["claimed", "recorded", "duplicate", "not_pending", "changed", "claimed_before",
                        "rejected_before"]


def seal_text(*, proposal_id: int | None, tool: str, action: str | None, arguments_json: str, arguments_hash: str,
              arguments_shown: str | None, subject: str, client: str, scopes: Sequence[str], rule: str, created_at: str,
              expires_at: str, approvers: int = 1, policy_reason: str | None = None,
              preview_json: str | None = None) -> str:
    """Everything that decides what an approval runs, who must approve it, and what the operator is shown
    of the current state (the preview as stored), bound to the proposal's id, as one text for the seal's
    MAC. Bound to its id, a sealed row copied into another (a call run once, staged again by someone who
    can write the database) fails its seal.

    `proposal_id=None` gives the text of the proposals staged before ids and previews were sealed, so
    their seals still hold: a proposal needing one approver and giving no reason is sealed there exactly
    as before quorums existed."""
    sealed: list[object] = [tool, action, arguments_json, arguments_hash, arguments_shown, subject, client,
                            sorted(scopes), rule, created_at, expires_at]
    if proposal_id is not None:  # "proposal" first: no older text starts with a name and then a number
        return canonical_json(["proposal", proposal_id, *sealed, approvers, policy_reason, preview_json])
    if approvers != 1 or policy_reason is not None:
        sealed += [approvers, policy_reason]
    return canonical_json(sealed)


def preview_text(preview: dict[str, Any] | None) -> str | None:
    """A preview as the store keeps it, and the seal covers it: the text itself, so the seal never
    depends on how JSON reads back."""
    return json.dumps(preview, ensure_ascii=False) if preview is not None else None


def person(name: str) -> str:
    """A subject as people compare them: case and surrounding or repeated whitespace ignored."""
    return " ".join(name.split()).casefold()


def same_person(one: str, other: str) -> bool:
    """Subjects compared as people would: case and surrounding or repeated whitespace ignored."""
    return person(one) == person(other)


def quorum_text(count: int, required: int, names: Sequence[str]) -> str:
    """`1 of 2 approvals (alice)`."""
    noun = "approval" if required == 1 else "approvals"
    return f"{count} of {required} {noun}" + (f" ({', '.join(names)})" if names else "")


def shown_status(status: str) -> str:
    """What an operator should read: a proposal left `executing` by a crash is not "running"."""
    return "executing (outcome unknown if the approver stopped)" if status == "executing" else status


class ProposalState(msgspec.Struct, frozen=True):
    """Where a proposal stands (its effective status) and who decided it: all a late operator is told.
    Read without the seal check, which covers what runs, never the status."""

    id: int
    status: Status
    expires_at: str
    decided_by: str | None = None
    decided_at: str | None = None

    @property
    def shown_status(self) -> str:
        return shown_status(self.status)


class Approval(msgspec.Struct, frozen=True):
    """One operator's approval of a proposal. It is sealed too (a server-keyed MAC binding it to
    the proposal's own seal), so an approval row written into the database counts for nothing."""

    operator: str
    """As recorded: the verified subject, or `local:NAME`."""
    person: str
    """`person(name)`: at most one approval per person and proposal."""
    approved_at: str
    seal: str

    def seal_text(self, proposal_id: int, proposal_seal: str | None) -> str:
        return canonical_json(["approval", proposal_id, proposal_seal, self.operator, self.person, self.approved_at])


class Proposal(msgspec.Struct, frozen=True):
    """A staged call as stored: its frozen arguments, proposer, seal, status and approvals."""
    id: int
    tool: str
    action: str | None
    arguments_json: str
    arguments_hash: str
    proposer_subject: str
    proposer_client: str
    proposer_scopes: tuple[str, ...]
    rule: str
    preview: dict[str, Any] | None
    status: Status
    created_at: str
    expires_at: str
    decided_by: str | None = None
    decided_at: str | None = None
    reason: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    result: dict[str, Any] | None = None
    error: str | None = None
    arguments_shown: str | None = None
    """The arguments with secrets masked: what people see. `arguments_json` is what runs; the seal
    covers both."""
    seal: str | None = None
    """A server-keyed MAC over `seal_text` (None: staged by release 0.1.0, before seals)."""
    approvers: int = 1
    """How many distinct operators must approve (the rule's `approvers`); sealed."""
    policy_reason: str | None = None
    """The reason of the rule that staged it, for the operator; sealed."""
    approvals: tuple[Approval, ...] = ()
    """The approvals recorded so far, oldest first."""
    preview_json: str | None = None
    """`preview` as stored; sealed, except by proposals staged before previews were (`seal_texts`)."""

    def seal_texts(self) -> Iterator[str]:
        """The texts a seal of this proposal may be the MAC of: the one bound to its id (with its preview),
        then (made only when asked: a seal that holds is checked once) the one proposals staged before that
        carry. No seal holds for both, so a proposal staged since cannot be made to pass as an older one."""
        yield self.seal_text()
        yield self.seal_text(older=True)

    def seal_text(self, *, older: bool = False) -> str:
        return seal_text(proposal_id=None if older else self.id, tool=self.tool, action=self.action,
                         arguments_json=self.arguments_json, arguments_hash=self.arguments_hash,
                         arguments_shown=self.arguments_shown, subject=self.proposer_subject,
                         client=self.proposer_client, scopes=self.proposer_scopes, rule=self.rule,
                         created_at=self.created_at, expires_at=self.expires_at, approvers=self.approvers,
                         policy_reason=self.policy_reason, preview_json=self.preview_json)

    @property
    def approved_by(self) -> list[str]:
        return [approval.operator for approval in self.approvals]

    @property
    def quorum(self) -> str:
        """`1 of 2 approvals (alice)`: what `knecht-approve list` and `show` print."""
        return quorum_text(len(self.approvals), self.approvers, self.approved_by)

    @property
    def arguments(self) -> dict[str, Any]:
        return json.loads(self.arguments_json)  # type: ignore[no-any-return]

    @property
    def shown_arguments(self) -> dict[str, Any]:
        return json_object(self.arguments_shown or self.arguments_json) or {}

    @property
    def proposer(self) -> Actor:
        return Actor(self.proposer_subject, self.proposer_client, frozenset(self.proposer_scopes))

    @property
    def call_name(self) -> str:
        return f"{self.tool}.{self.action}" if self.action else self.tool

    @property
    def shown_status(self) -> str:
        return shown_status(self.status)

    @property
    def state(self) -> ProposalState:
        return ProposalState(self.id, self.status, self.expires_at, self.decided_by, self.decided_at)

    def sealed(self) -> tuple[object, ...]:
        """Everything the seal covers, and the seal: a row alike here with a proposal whose seal held runs
        the same call, as the same proposer, approved by the same quorum (no MAC to compute again)."""
        return (self.id, self.tool, self.action, self.arguments_json, self.arguments_hash, self.arguments_shown,
                self.proposer_subject, self.proposer_client, self.proposer_scopes, self.rule, self.created_at,
                self.expires_at, self.approvers, self.policy_reason, self.preview_json, self.seal)

    def document(self) -> dict[str, Any]:
        """The proposal as operators see it (the decision API, `knecht-approve --json`)."""
        return {**self.public(), "proposer": {"subject": self.proposer_subject, "client": self.proposer_client,
                                             "scopes": list(self.proposer_scopes)},
                "rule": self.rule, "policy_reason": self.policy_reason, "preview": self.preview,
                "started_at": self.started_at,
                "approvals": [{"operator": a.operator, "approved_at": a.approved_at} for a in self.approvals]}

    @classmethod
    def from_document(cls, document: dict[str, Any]) -> Proposal:
        """A proposal as the decision API described it (for `knecht-approve --server`): the masked
        arguments stand in for the exact ones, which never leave the server."""
        shown = canonical_json(document["arguments"])
        proposer = document["proposer"]
        return cls(
            id=document["id"], tool=document["tool"], action=document["action"], arguments_json=shown,
            arguments_hash=document["arguments_hash"], proposer_subject=proposer["subject"],
            proposer_client=proposer["client"], proposer_scopes=tuple(proposer["scopes"]), rule=document["rule"],
            preview=document["preview"], status=document["status"], created_at=document["created_at"],
            expires_at=document["expires_at"], decided_by=document["decided_by"], decided_at=document["decided_at"],
            reason=document["reason"], started_at=document["started_at"], finished_at=document["finished_at"],
            result=document["result"], error=document["error"], arguments_shown=shown,
            approvers=document.get("approvers", 1), policy_reason=document.get("policy_reason"),
            approvals=tuple(Approval(a["operator"], person(a["operator"]), a["approved_at"], "")
                            for a in document.get("approvals", [])),
        )

    def public(self) -> dict[str, Any]:
        """The proposal as the proposer's agent sees it."""
        return {
            "id": self.id, "tool": self.tool, "action": self.action, "status": self.status,
            "arguments": self.shown_arguments, "arguments_hash": self.arguments_hash,
            "created_at": self.created_at, "expires_at": self.expires_at,
            "decided_by": self.decided_by, "decided_at": self.decided_at, "reason": self.reason,
            "finished_at": self.finished_at, "result": self.result, "error": self.error,
            "approvers": self.approvers, "quorum": self.quorum,
        }


class NewProposal(msgspec.Struct, frozen=True):
    """A call the gate stages: what the store writes as a new pending proposal."""
    tool: str
    action: str | None
    arguments_json: str
    arguments_hash: str
    arguments_shown: str
    proposer: Actor
    rule: str
    preview_json: str | None
    """The current state shown to operators, as `preview_text` wrote it (what the store keeps, and seals)."""
    created_at: str
    expires_at: str
    approvers: int = 1
    policy_reason: str | None = None

    def seal_text(self, proposal_id: int) -> str:
        """The text its seal is the MAC of, once the store has given it `proposal_id`."""
        return seal_text(proposal_id=proposal_id, tool=self.tool, action=self.action,
                         arguments_json=self.arguments_json, arguments_hash=self.arguments_hash,
                         arguments_shown=self.arguments_shown, subject=self.proposer.subject,
                         client=self.proposer.client, scopes=sorted(self.proposer.scopes), rule=self.rule,
                         created_at=self.created_at, expires_at=self.expires_at, approvers=self.approvers,
                         policy_reason=self.policy_reason, preview_json=self.preview_json)


Sealer = Callable[[int], str]
"""`seal(proposal_id) -> seal`: a new proposal's seal, under the id the store gives it."""


class Turn(msgspec.Struct, frozen=True):
    """A proposal's turn for a decision (`ProposalRepository.turn`)."""

    ours: bool
    state: ProposalState | None = None
    """Not ours: where the proposal stands now that the turn before settled it (None: it does not exist)."""
    proposal: Proposal | None = None
    """Ours: the proposal as read just before the turn, when it was had without waiting (None: read it now)."""


class QuorumResult(msgspec.Struct, frozen=True):
    """What an approval did (`ProposalRepository.add_approval`)."""

    outcome: QuorumOutcome
    claimed: Proposal | None = None
    """`claimed`: the proposal as the claim left it (executing), with the approvals that count."""
    state: ProposalState | None = None
    """`not_pending`: where the proposal stood when this approval's turn came (None: it does not exist)."""
    approvals: tuple[Approval, ...] = ()
    """`recorded`: the approvals that count so far, this one last."""


class ProposalRepository(Protocol):
    """Persistence of proposals. Every transition is one conditional, atomic update, committed
    durably together with the audit row that records it; every read shows the effective status
    (an overdue pending proposal reads as `expired`)."""

    async def create(self, proposal: NewProposal, staged: AuditEntry, seal: Sealer) -> tuple[int, bool]:
        """Store a pending proposal, sealed by `seal` under its new id, and its `staged` audit row;
        `(id, False)` when an identical call of the same proposer is pending already (its id; the row
        records that instead)."""
        ...
    async def get(self, proposal_id: int) -> Proposal | None: ...
    async def state(self, proposal_id: int) -> ProposalState | None:
        """Where a proposal stands, cheaply (one short row by key): a late operator needs no more."""
        ...
    async def list(self, *, status: str | None = None, subject: str | None = None, limit: int = 100,
                   after_id: int = 0, before_id: int | None = None,
                   oldest_first: bool = False) -> builtins.list[Proposal]:
        """Newest first (or oldest first), by effective status and proposer; `after_id` and
        `before_id` page by id."""
        ...
    def turn(self, proposal_id: int) -> AbstractAsyncContextManager[Turn]:
        """Wait for this proposal's turn to be decided — racing approvals of it queue here, outside any
        transaction and without the store's write lock — and hold it while deciding. One that comes late,
        or had to wait and finds the proposal no longer pending, is told so (`Turn.ours` False): the many
        operators who come too late learn it from one read, or from the decision of this process
        they queued behind."""
        ...
    async def expire_overdue(self, now: str, audit: Callable[[Proposal], AuditEntry]) -> builtins.list[Proposal]:
        """Write `expired` (and its audit row) on every overdue pending proposal; return those."""
        ...
    async def add_approval(self, proposal_id: int, approval: Approval, *, required: int,
                           counts: Callable[[Approval], bool],
                           audit: Callable[[tuple[Approval, ...], bool], AuditEntry],
                           approved_as: Proposal | None = None) -> QuorumResult:
        """Record `approval` of a pending proposal, serialised with every other approval of it (across
        processes and replicas). The approval that makes `required` distinct persons (counting only
        approvals for which `counts` holds) also claims it, pending → approved and executing, in the
        same transaction: `claimed` for exactly one caller. Otherwise `recorded`, `duplicate` (this person
        approved already) or `not_pending`. `audit(counted, completes)` is the row committed with it.
        `approved_as`: the proposal as the operator approved it (its seal checked); a claim of a row that
        differs from it (`Proposal.sealed`) is rolled back: `changed`. A proposal claimed once and written
        back to pending in the database (its earlier approvals complete the quorum, or the audit log holds
        its `approved` row) is refused with nothing written: `claimed_before`; one rejected and written back
        (the audit log holds its `rejected` row) likewise: `rejected_before`."""
        ...
    async def reject(self, proposal_id: int, operator: str, reason: str, now: str, audit: AuditEntry) -> bool: ...
    async def finish(self, proposal_id: int, *, succeeded: bool, result_json: str | None,
                     error: str | None, now: str, audit: AuditEntry,
                     approvals: tuple[Approval, ...] = ()) -> Proposal | None:
        """executing → succeeded | failed: the proposal as it now is, with `approvals` (the caller knows
        them: they do not change once it was claimed), or None when it was not executing."""
        ...
    async def settled(self, ids: Sequence[int]) -> dict[int, tuple[str, str]]:
        """`id → (status, proposer subject)` for those of `ids` that are no longer pending (decided,
        executing, or past their expiry): a watcher of many waiting proposals reads only the few
        that moved."""
        ...
    async def take_unseen(self, subject: str, limit: int) -> builtins.list[Proposal]:
        """The proposer's decided proposals it has not seen yet (oldest first), now marked seen: each
        is returned once, also when two sessions ask at once."""
        ...
    async def mark_seen(self, proposal_id: int) -> None:
        """The proposer has seen this proposal's outcome (e.g. through get_proposal)."""
        ...
