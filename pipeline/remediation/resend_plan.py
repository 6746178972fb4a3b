"""Pure planning of a resend run: the audit's candidates, checked again
against the live ledgers, become sends, skips or hand-overs to a person.

The audit judged the stubs at its as-of time; the ledgers may have moved since (a stub
confirmed, resent by an earlier run, consumed). A candidate is sent only if its stub is
still UNCONFIRMED with the send count the audit saw, due at the run's time, and its msg id
is still absent from the consumers' log; so running the same resend twice sends nothing
twice. Stubs at the max send count, and messages whose body is nowhere to be found, go to
manual handling.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from broker_runtime.common.message import KEYS, TAGS, UNIQ_KEY, Message
from broker_runtime.ledger.schema import StubStatus
from pipeline.remediation.rabbit_sender import RabbitMessage, headers_of
from pipeline.remediation.replay_plan import BROKER_PROPERTIES

RESEND_RUN_PROPERTY = "MQAUDIT_RESEND_RUN"  # a RabbitMQ resend's run id, a header


class Action(StrEnum):
    SENT = "sent"  # resent and acknowledged: stub confirmed at its new offset
    FAILED = "failed"  # resent, no acknowledgement: stub backed off, tried again later
    SKIPPED = "skipped"  # nothing to do (any more)
    MANUAL = "manual"  # given up (stub VOID): a person must look at it


@dataclass(frozen=True)
class Candidate:
    """A stub as the audit saw it (a `resend_candidates` or `manual_handling` row)."""

    msg_id: str
    topic: str
    tags: str | None
    keys: str | None
    body_hash: str
    send_count: int
    system: str | None = None  # rocketmq (None: a table written before `system`) or rabbitmq

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> Candidate:
        return cls(
            row["msg_id"],
            row["topic"],
            row["tags"],
            row["keys"],
            row["body_hash"],
            int(row["send_count"]),
            row.get("system"),
        )

    @property
    def rabbitmq(self) -> bool:
        return self.system == "rabbitmq"


@dataclass(frozen=True)
class Decision:
    candidate: Candidate
    action: Action | None  # None: send it
    reason: str


@dataclass
class ResendPlan:
    to_send: list[Candidate] = field(default_factory=list)
    decided: list[Decision] = field(default_factory=list)  # skips and hand-overs

    @property
    def manual(self) -> list[Decision]:
        return [d for d in self.decided if d.action is Action.MANUAL]


def _stale(c: Candidate, stub: Mapping[str, Any] | None, as_of_ms: int) -> str | None:
    """Why the audit's view of the stub no longer holds, or None if it still does."""
    if stub is None:
        return "stub no longer in the producer ledger"
    if stub["status"] != StubStatus.UNCONFIRMED:
        return f"stub is {stub['status']} now"
    if int(stub["send_count"]) != c.send_count:
        return f"resent since the audit (send count {c.send_count} -> {stub['send_count']})"
    due = stub["next_resend_at"]
    if due is not None and int(due) > as_of_ms:
        return f"not due before {due}"
    return None


def plan_resend(
    candidates: Sequence[Candidate],
    manual: Sequence[Candidate],
    stubs: Mapping[str, Mapping[str, Any]],
    consumed: Iterable[str],
    max_send_count: int,
    as_of_ms: int,
) -> ResendPlan:
    """`stubs`: the live stubs by msg_id; `consumed`: msg ids now in the consumers' log."""
    logged = set(consumed)
    plan = ResendPlan()
    for c in candidates:
        stale = _stale(c, stubs.get(c.msg_id), as_of_ms)
        if stale is not None:
            plan.decided.append(Decision(c, Action.SKIPPED, stale))
        elif c.msg_id in logged:
            plan.decided.append(Decision(c, Action.SKIPPED, "consumed since the audit"))
        elif c.send_count >= max_send_count:
            plan.decided.append(Decision(c, Action.MANUAL, f"send count {c.send_count} at max"))
        else:
            plan.to_send.append(c)
    for c in manual:
        stub = stubs.get(c.msg_id)
        if stub is None or stub["status"] != StubStatus.UNCONFIRMED:
            state = "gone" if stub is None else stub["status"]
            plan.decided.append(Decision(c, Action.SKIPPED, f"stub is {state} now"))
        else:
            count = int(stub["send_count"])
            plan.decided.append(
                Decision(c, Action.MANUAL, f"send count {count} at max ({max_send_count})")
            )
    return plan


def body_hash_ok(body: bytes, expected: str) -> bool:
    return hashlib.sha256(body).hexdigest() == expected


def resend_message(c: Candidate, body: bytes, properties: Mapping[str, str] | None) -> Message:
    """The message sent again: same UNIQ_KEY, topic, tags and keys; a stored copy's own
    properties when the body came from one (less the broker's bookkeeping)."""
    props = {k: v for k, v in (properties or {}).items() if k not in BROKER_PROPERTIES}
    props[UNIQ_KEY] = c.msg_id
    if c.tags:
        props[TAGS] = c.tags
    if c.keys:
        props[KEYS] = c.keys
    return Message(topic=c.topic, body=body, properties=props)


def resend_rabbit_message(
    c: Candidate, stub: Mapping[str, Any], body: bytes, run_id: str
) -> RabbitMessage:
    """A RabbitMQ stub published again: its exchange, routing key, headers and message_id,
    plus the run's id."""
    headers = {**headers_of(stub.get("headers")), RESEND_RUN_PROPERTY: run_id}
    return RabbitMessage(c.topic, stub.get("routing_key") or "", body, c.msg_id, headers)
