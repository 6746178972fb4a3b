"""truth.json: what the workload did, in the audit's terms. Pure: facts in, findings out.

Shape: `{"seed", "messages", "run_id", "data_dir", "started_at", "finished_at",
"scenarios": {NAME: {"description", "data_dir", "topic", "groups", "messages",
"injected": {...}, "findings": [{"kind", "msg_id", "group", "count", "cause", "topic"}],
"expected": {kind: number of findings}, "stats": {...}}}}`.

Kinds and counts: `stored_twice` (group null; count = copies stored), `delivered_twice` and
`retried_then_ok` (count = deliveries to the group), `dead_lettered` (count = failed
consumptions, the dead letter's reconsume times), `lost_after_ack` (count 1), `resend_due`
(group null; count = sends so far, 1: a send no SEND_OK answered leaves its stub UNCONFIRMED
with no queue offset, due for the resend job). Each has the cause the audit gives it:
`producer_resend` for `stored_twice`; `max_reconsume_times` (or `sent_to_dlq_directly`) for
a dead letter; `absent_from_commitlog` for a loss; `never_acknowledged` for a resend. The
transaction kinds (`half_stuck`, `check_gave_up`, `committed_twice`: group null;
`rolled_back_but_delivered`, `committed_never_consumed`: per consumer group) come with the
causes of pipeline/transforms/transaction_audit.py.

A group's deliveries of one message are explained one by one from the delivery before, by
the audit's rules (`pipeline/transforms/duplicates.py` states them; `cause_of` is the same
rules in Python), applied to what the consumers journaled: from another stored copy,
`producer_resend`; after a failure, `retry_after_failure`; while another client still held
the queue, `rebalance_overlap`; after one that never finished, `redelivery_after_restart`;
after one that was CONSUMED, `offset_not_committed`. Any cause but a retry makes the message
`delivered_twice` (with the first such cause); only retries, ending CONSUMED, make it
`retried_then_ok`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from broker_runtime.common.findings import (
    ABSENT_FROM_COMMITLOG,
    DEAD_LETTERED,
    DELIVERED_TWICE,
    LOST_AFTER_ACK,
    MAX_RECONSUME_TIMES,
    NEVER_ACKNOWLEDGED,
    OFFSET_NOT_COMMITTED,
    PRODUCER_RESEND,
    REBALANCE_OVERLAP,
    REDELIVERY_AFTER_RESTART,
    RESEND_DUE,
    RETRIED_THEN_OK,
    RETRY_AFTER_FAILURE,
    SENT_TO_DLQ_DIRECTLY,
    STORED_TWICE,
    TRANSACTION_KINDS_WITHOUT_GROUP,
    TRUTH_KINDS,
)
from broker_runtime.common.topics import is_retry_topic
from broker_runtime.workload.journal import Delivery

FAILURES = ("RECONSUME_LATER", "FAILED")

Finding = dict[str, Any]
QueueKey = tuple[str, str, str, int]  # client, topic pulled from, broker, queue id


def finding(
    kind: str, msg_id: str, group: str | None, count: int, topic: str, cause: str | None = None
) -> Finding:
    """One finding; a dead letter's or a loss's cause, unless given, is the audit's for it."""
    cause = cause or default_cause(kind, count)
    out: Finding = {"kind": kind, "msg_id": msg_id, "group": group, "count": count}
    if cause is not None:
        out["cause"] = cause
    out["topic"] = topic
    return out


def default_cause(kind: str, count: int) -> str | None:
    if kind == DEAD_LETTERED:
        return MAX_RECONSUME_TIMES if count > 1 else SENT_TO_DLQ_DIRECTLY
    if kind == LOST_AFTER_ACK:  # the workload's losses are never delivered before
        return ABSENT_FROM_COMMITLOG
    if kind == RESEND_DUE:  # the workload's stubs are either confirmed or never answered
        return NEVER_ACKNOWLEDGED
    return None


class QueueActivity:
    """When each client of one group took messages from each queue, and until when it was
    busy with them (a delivery that never finished counts until its receipt)."""

    def __init__(self, deliveries: Iterable[Delivery]) -> None:
        self._spans: dict[QueueKey, list[tuple[int, int]]] = {}
        for d in deliveries:
            end = d.finished_at if d.finished_at is not None else d.received_at
            self._spans.setdefault(self.key(d.client, d), []).append((d.received_at, end))

    @staticmethod
    def key(client: str, d: Delivery) -> QueueKey:
        return client, d.topic, d.broker, d.queue_id

    def held_by(self, client: str, this: Delivery) -> bool:
        """Whether `client` still held the queue `this` came from when it came: busy there
        with a message received no later, or taking another from it afterwards while
        `this`'s client was still taking messages from it."""
        theirs = self._spans.get(self.key(client, this), [])
        t = this.received_at
        if any(start <= t <= end for start, end in theirs):
            return True
        later = [start for start, _ in theirs if start > t]
        mine = self._spans.get(self.key(this.client, this), [])
        return bool(later and mine) and min(later) <= max(start for start, _ in mine)


def cause_of(prev: Delivery, this: Delivery, queues: QueueActivity) -> str:
    """Why `this` delivery followed `prev` (same group, same message); the first rule that
    holds, in the audit's order."""
    if (
        not is_retry_topic(this.topic)
        and not is_retry_topic(prev.topic)
        and this.position != prev.position
    ):
        return PRODUCER_RESEND
    if prev.outcome in FAILURES:
        return RETRY_AFTER_FAILURE
    if prev.client != this.client and queues.held_by(prev.client, this):
        return REBALANCE_OVERLAP
    if prev.outcome is None:
        return REDELIVERY_AFTER_RESTART
    return OFFSET_NOT_COMMITTED


def delivery_findings(group: str, topic: str, deliveries: Sequence[Delivery]) -> list[Finding]:
    """delivered_twice / retried_then_ok findings of one group's deliveries."""
    queues = QueueActivity(deliveries)
    by_msg: dict[str, list[Delivery]] = {}
    for d in sorted(deliveries, key=lambda d: d.received_at):
        by_msg.setdefault(d.msg_id, []).append(d)
    out = []
    for msg_id, seq in sorted(by_msg.items()):
        if len(seq) < 2:
            continue
        causes = [cause_of(a, b, queues) for a, b in itertools.pairwise(seq)]
        other = [c for c in causes if c != RETRY_AFTER_FAILURE]
        if other:
            out.append(finding(DELIVERED_TWICE, msg_id, group, len(seq), topic, other[0]))
        elif seq[-1].outcome == "CONSUMED":
            out.append(
                finding(RETRIED_THEN_OK, msg_id, group, len(seq), topic, RETRY_AFTER_FAILURE)
            )
    return out


def stored_twice_findings(
    copies: Mapping[str, Iterable[tuple[str, str, int, int]]], topic: str
) -> list[Finding]:
    """UNIQ_KEYs stored at two or more positions of `topic`."""
    out = []
    for msg_id, positions in sorted(copies.items()):
        n = len({p for p in positions if p[0] == topic})
        if n >= 2:
            out.append(finding(STORED_TWICE, msg_id, None, n, topic, PRODUCER_RESEND))
    return out


def expected(findings: Iterable[Finding]) -> dict[str, int]:
    counts = dict.fromkeys(TRUTH_KINDS, 0)
    for f in findings:
        counts[f["kind"]] += 1
    return counts


def scenario_entry(
    *,
    description: str,
    data_dir: str,
    topic: str,
    groups: Sequence[str],
    messages: int,
    injected: Mapping[str, Any],
    findings: Sequence[Finding],
    stats: Mapping[str, Any],
) -> dict[str, Any]:
    return {
        "description": description,
        "data_dir": data_dir,
        "topic": topic,
        "groups": list(groups),
        "messages": messages,
        "injected": dict(injected),
        "findings": sorted(findings, key=lambda f: (f["kind"], f["msg_id"], f["group"] or "")),
        "expected": expected(findings),
        "stats": dict(stats),
    }


def summary(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The final line: finding counts per scenario and kind, and the rebalance comparison."""
    scenarios = doc["scenarios"]
    out: dict[str, Any] = {
        "run_id": doc["run_id"],
        "seed": doc["seed"],
        "messages": doc["messages"],
        "seconds": round((doc["finished_at"] - doc["started_at"]) / 1000, 1),
        "scenarios": {
            n: {k: v for k, v in s["expected"].items() if v} for n, s in scenarios.items()
        },
    }
    dups = {
        name.removeprefix("rebalance_"): scenarios[name]["stats"].get("duplicate_deliveries")
        for name in ("rebalance_lock_off", "rebalance_lock_on")
        if name in scenarios
    }
    if dups:
        out["rebalance_duplicate_deliveries"] = dups
    return out


def validate(doc: Any) -> None:
    """Raise ValueError saying what is wrong with a truth document's shape."""
    if not isinstance(doc, dict):
        raise ValueError("truth must be a JSON object")
    for key, kind in (("seed", int), ("messages", int), ("scenarios", dict)):
        if not isinstance(doc.get(key), kind):
            raise ValueError(f"truth needs {key!r} ({kind.__name__})")
    for name, s in doc["scenarios"].items():
        for key in ("description", "data_dir", "findings", "expected"):
            if key not in s:
                raise ValueError(f"scenario {name} has no {key!r}")
        for f in s["findings"]:
            if f.get("kind") not in TRUTH_KINDS:
                raise ValueError(f"scenario {name}: unknown kind {f.get('kind')!r}")
            if not isinstance(f.get("msg_id"), str) or not f["msg_id"]:
                raise ValueError(f"scenario {name}: a finding without msg_id")
            if not isinstance(f.get("count"), int) or f["count"] < 1:
                raise ValueError(f"scenario {name}: finding {f['msg_id']} has a bad count")
            no_group = (STORED_TWICE, LOST_AFTER_ACK, RESEND_DUE, *TRANSACTION_KINDS_WITHOUT_GROUP)
            if (f["kind"] in no_group) != (f["group"] is None):
                raise ValueError(f"scenario {name}: {f['kind']} {f['msg_id']}: group mismatch")
        if s["expected"] != expected(s["findings"]):
            raise ValueError(f"scenario {name}: expected counts do not match its findings")
