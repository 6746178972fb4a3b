"""Pure planning of a DLQ replay over the dead letters and the replay log (`dlq_replay_log`);
the loss repair (`repair_log`, pipeline.jobs.repair) plans by the same rules (`plan_sends`).

The log is append-only: one row per event (planned, sent with its new offset, skipped and
why, failed and why); a message's state in one replay is its latest row. The rules:

- a replay id plans once: planning again returns the plan already logged (a retried task);
- a message some replay sent is never planned again unless forced;
- a message whose outcome in another replay is unknown (planned, not dry-run, no later row:
  that run died mid-send) is not planned until reconciled against the broker (`in_doubt`);
- in one replay, what was sent stays sent; what failed or is still planned is sent on resume.

The replayed message goes to the original topic with the original UNIQ_KEY, KEYS, TAGS and
user properties, without the broker's retry bookkeeping, plus the replay id and the offset id
of the dead-letter copy it came from.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from broker_runtime.common.message import (
    DELAY,
    MAX_RECONSUME_TIMES,
    ORIGIN_MESSAGE_ID,
    REAL_QUEUE_ID,
    REAL_TOPIC,
    RECONSUME_TIME,
    REPLAY_ID_PROPERTY,
    REPLAY_OF_PROPERTY,
    RETRY_TOPIC,
    UNIQ_KEY,
    Message,
)
from broker_runtime.common.topics import is_dlq_topic, is_retry_topic
from pipeline.remediation.reasons import outcome_unknown
from pipeline.remediation.replay_request import ReplayRequest

# Set by the broker on the way to the DLQ (or on a pull): not part of the message as sent.
BROKER_PROPERTIES = frozenset(
    {
        RETRY_TOPIC,
        ORIGIN_MESSAGE_ID,
        REAL_TOPIC,
        REAL_QUEUE_ID,
        DELAY,
        RECONSUME_TIME,
        MAX_RECONSUME_TIMES,
        "MIN_OFFSET",
        "MAX_OFFSET",
        "CLUSTER",
    }
)
DRY_RUN_REASON = "dry run: would be sent"
TO_SEND_REASON = "to send"


class Status(StrEnum):
    PLANNED = "planned"
    SENT = "sent"
    SKIPPED = "skipped"
    FAILED = "failed"


@dataclass(frozen=True)
class DeadLetter:
    """One dead letter to consider: the earliest DLQ copy of a message for its group."""

    msg_id: str  # the UNIQ_KEY the replay keeps
    group: str
    topic: str | None  # the original topic; None if the copy does not say
    dlq_msg_id: str  # offset msg id of the DLQ copy
    store_ts: int


class Sendable(Protocol):
    """What a send run plans: a message by its UNIQ_KEY, where it goes, whose it is."""

    @property
    def msg_id(self) -> str: ...
    @property
    def group(self) -> str | None: ...
    @property
    def topic(self) -> str | None: ...


@dataclass(frozen=True)
class LogEntry:
    """One `dlq_replay_log` row (a `repair_log` row: the run id is its repair id, no group)."""

    replay_id: str
    msg_id: str
    group: str | None
    topic: str | None
    status: Status
    reason: str | None
    new_offset: int | None
    ts: int

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> LogEntry:
        return cls(
            row["replay_id"],
            row["msg_id"],
            row["group"],
            row["topic"],
            Status(row["status"]),
            row["reason"],
            row["new_offset"],
            int(row["ts"]),
        )

    def as_row(self) -> dict[str, Any]:
        return {
            "replay_id": self.replay_id,
            "msg_id": self.msg_id,
            "group": self.group,
            "topic": self.topic,
            "status": self.status.value,
            "reason": self.reason,
            "new_offset": self.new_offset,
            "ts": self.ts,
        }


@dataclass
class ReplayPlan:
    replay_id: str
    dry_run: bool
    new: bool  # False: the plan was already logged (a retried task)
    planned: list[LogEntry] = field(default_factory=list)
    skipped: list[LogEntry] = field(default_factory=list)
    left_over: int = 0  # matching messages beyond max_messages, not planned

    @property
    def rows(self) -> list[LogEntry]:
        """What planning appends to the log (nothing for a plan already logged)."""
        return [*self.planned, *self.skipped] if self.new else []

    def summary(self) -> dict[str, Any]:
        reasons: dict[str, int] = {}
        for e in self.skipped:
            key = (e.reason or "").split(" (")[0]
            reasons[key] = reasons.get(key, 0) + 1
        return {
            "replay_id": self.replay_id,
            "dry_run": self.dry_run,
            "new_plan": self.new,
            "planned": len(self.planned),
            "skipped": len(self.skipped),
            "skipped_by_reason": reasons,
            "left_over": self.left_over,
        }


def replay_id_for(*parts: str, kind: str = "replay") -> str:
    """A stable run id (e.g. of dag id + run id): a retried run keeps its id."""
    return f"{kind}-" + hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:16]


def latest(entries: Iterable[LogEntry]) -> dict[tuple[str, str], LogEntry]:
    """(replay_id, msg_id) -> the entry that tells the message's state in that replay."""
    out: dict[tuple[str, str], LogEntry] = {}
    rank = {Status.PLANNED: 0, Status.SKIPPED: 1, Status.FAILED: 1, Status.SENT: 2}
    for e in entries:
        key = (e.replay_id, e.msg_id)
        have = out.get(key)
        # Later wins; at one ms an outcome beats `planned`, and `sent` beats everything.
        if have is None or (e.ts, rank[e.status]) >= (have.ts, rank[have.status]):
            out[key] = e
    return out


def where_they_stand(entries: Iterable[LogEntry]) -> dict[str, Any]:
    """Where every message of one run stands (its latest entry), with a few examples."""
    state = sorted(latest(entries).values(), key=lambda e: e.msg_id)
    by_status: dict[str, int] = {}
    for e in state:
        by_status[e.status.value] = by_status.get(e.status.value, 0) + 1
    examples = {s.value: [e.as_row() for e in state if e.status is s][:5] for s in Status}
    return {"messages": len(state), "by_status": by_status, "examples": examples}


def is_in_doubt(e: LogEntry) -> bool:
    """Planned for a real send with no outcome logged, or failed with an unknown outcome:
    the message may be on the broker."""
    if e.status is Status.PLANNED:
        return e.reason != DRY_RUN_REASON
    return e.status is Status.FAILED and outcome_unknown(e.reason)


def in_doubt(entries: Iterable[LogEntry], exclude_replay: str | None = None) -> list[LogEntry]:
    """Entries to reconcile against the broker before planning or resuming."""
    return [
        e
        for (rid, _), e in sorted(latest(entries).items())
        if is_in_doubt(e) and rid != exclude_replay
    ]


def plan_sends(
    run_id: str,
    items: Sequence[Sendable],
    log: Sequence[LogEntry],
    now_ms: int,
    *,
    dry_run: bool,
    force: bool,
    max_messages: int,
    unsendable: Mapping[str, str] | None = None,
    done: str = "already replayed",
) -> ReplayPlan:
    """The rules of a logged, resumable send run (a replay or a repair) over `items`, oldest
    first; `log` is the run kind's log (one group's, for a replay). `unsendable`: msg_id ->
    why it cannot be sent (skipped with that reason)."""
    mine = [e for e in log if e.replay_id == run_id]
    if mine:
        state = latest(mine).values()
        return ReplayPlan(
            run_id,
            dry_run,
            new=False,
            planned=[e for e in state if e.status is not Status.SKIPPED],
            skipped=[e for e in state if e.status is Status.SKIPPED],
        )
    sent: dict[str, LogEntry] = {}
    doubt: dict[str, LogEntry] = {}
    for e in latest(log).values():
        if e.status is Status.SENT and e.msg_id not in sent:
            sent[e.msg_id] = e
        elif is_in_doubt(e):
            doubt[e.msg_id] = e
    plan = ReplayPlan(run_id, dry_run, new=True)
    reason_planned = DRY_RUN_REASON if dry_run else TO_SEND_REASON
    refused = unsendable or {}

    def entry(d: Sendable, status: Status, reason: str) -> LogEntry:
        return LogEntry(run_id, d.msg_id, d.group, d.topic, status, reason, None, now_ms)

    for d in items:
        if d.msg_id in refused:
            plan.skipped.append(entry(d, Status.SKIPPED, refused[d.msg_id]))
        elif d.msg_id in doubt:
            other = doubt[d.msg_id]
            plan.skipped.append(
                entry(d, Status.SKIPPED, f"outcome unknown in {other.replay_id} (reconcile first)")
            )
        elif d.msg_id in sent and not force:
            prior = sent[d.msg_id]
            plan.skipped.append(
                entry(
                    d,
                    Status.SKIPPED,
                    f"{done} (by {prior.replay_id}, offset {prior.new_offset}, "
                    f"at {prior.ts}; force=true to send again)",
                )
            )
        elif len(plan.planned) < max_messages:
            plan.planned.append(entry(d, Status.PLANNED, reason_planned))
        else:
            plan.left_over += 1
    return plan


def plan_replay(
    replay_id: str,
    request: ReplayRequest,
    dead_letters: Sequence[DeadLetter],
    log: Sequence[LogEntry],
    now_ms: int,
) -> ReplayPlan:
    """Decide what this replay sends; `dead_letters` match the request, oldest first."""
    no_topic = {
        d.msg_id: "no original topic on the dead letter"
        for d in dead_letters
        if d.topic is None or is_retry_topic(d.topic) or is_dlq_topic(d.topic)
    }
    return plan_sends(
        replay_id,
        dead_letters,
        [e for e in log if e.group == request.group or e.replay_id == replay_id],
        now_ms,
        dry_run=request.dry_run,
        force=request.force,
        max_messages=request.max_messages,
        unsendable=no_topic,
    )


def pending(replay_id: str, log: Sequence[LogEntry]) -> list[LogEntry]:
    """What this replay still has to send: planned or failed, never sent (resume order)."""
    state = latest(e for e in log if e.replay_id == replay_id)
    out = [
        e
        for e in state.values()
        if (e.status is Status.PLANNED and e.reason != DRY_RUN_REASON) or e.status is Status.FAILED
    ]
    return sorted(out, key=lambda e: (e.ts, e.msg_id))


def replay_message(
    topic: str,
    body: bytes,
    properties: Mapping[str, str],
    msg_id: str,
    replay_id: str,
    dlq_msg_id: str,
) -> Message:
    """The message a replay sends: as first sent, plus where it came from."""
    props = {k: v for k, v in properties.items() if k not in BROKER_PROPERTIES}
    props[UNIQ_KEY] = msg_id
    props[REPLAY_ID_PROPERTY] = replay_id
    props[REPLAY_OF_PROPERTY] = dlq_msg_id
    return Message(topic=topic, body=body, properties=props)
