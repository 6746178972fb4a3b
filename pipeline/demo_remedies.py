"""The demo's repair loop in numbers: for each finding kind, what the first mq_audit found,
what its remedy did, and what the mq_audit after the remedies still finds (pure over the
DAG runs' summaries).

A kind's loop is closed when the remedy acted and the audit after it finds exactly the ones
it acted on no more: resend_due by mq_retry_resend, on the cluster(s) it ran for (the stubs
confirmed at their new offsets; a resent message that the broker had stored after all, its
answer lost, is then stored twice: the loop says how many more the audit after finds, and,
per other cluster, how many stubs are due there and why the demo resends none of them),
dead_lettered by mq_dlq_replay (one group's dead letters, marked replayed),
lost_after_ack by mq_loss_repair on the master-crash cluster (sent again from the
producer's kept bodies, the stubs confirmed at the new positions). The other kinds have no
remedy the demo can run, and `NO_REMEDY` says why for each.
"""

from __future__ import annotations

from typing import Any

from broker_runtime.common.findings import (
    CHECK_GAVE_UP,
    COMMITTED_NEVER_CONSUMED,
    COMMITTED_TWICE,
    DEAD_LETTERED,
    DELIVERED_TWICE,
    DUPLICATE_EFFECT,
    FILTERED_WRONGLY,
    HALF_STUCK,
    LOST_AFTER_ACK,
    RESEND_DUE,
    RETRIED_THEN_OK,
    ROCKETMQ,
    ROLLED_BACK_BUT_DELIVERED,
    STORED_TWICE,
)
from pipeline.reports.summary import system_summary

NO_REMEDY: dict[str, str] = {
    STORED_TWICE: "nothing to undo on the broker: consumers must be idempotent (the de-dup "
    "table), and duplicate_effect shows where they were not",
    DELIVERED_TWICE: "at-least-once delivery by design: consumers must be idempotent",
    DUPLICATE_EFFECT: "the work was done twice in the consumer's own system: a person "
    "reverses it there",
    RETRIED_THEN_OK: "no fault: retried as designed, then consumed",
    LOST_AFTER_ACK: "repaired from the producer ledger's kept bodies by `mqaudit pipeline "
    "repair` (or mq_loss_repair); this run repaired none",
    HALF_STUCK: "the producer's check-back decides; a person commits or rolls back",
    CHECK_GAVE_UP: "RocketMQ gave up checking: a person decides (the admin command puts the "
    "message back under checking)",
    ROLLED_BACK_BUT_DELIVERED: "the consumer acted on a rolled-back message: a person reverses it",
    COMMITTED_TWICE: "a broker fault: consumers must be idempotent",
    COMMITTED_NEVER_CONSUMED: "the group must consume it (see its lag)",
    FILTERED_WRONGLY: "an instance of the group subscribed otherwise: deploy it with the "
    "group's expression; what it skipped comes back by resetting the group's offset",
}


# Why the demo resends on its own cluster only. The only other cluster with resend_due
# findings is the synchronous master crash's: its master stored those sends but answered
# SLAVE_NOT_AVAILABLE (its slave stopped), so their stubs stay UNCONFIRMED. The resend rules
# look at the consumers' log, not at the store: resent, every one was stored twice (83 of
# 83 in a demo of 2,000 messages).
RESEND_ELSEWHERE = "answered SLAVE_NOT_AVAILABLE but stored: a resend would store each twice"


def _loop(remedy: str, found: int, acted: int, left: int) -> dict[str, Any]:
    return {
        "remedy": remedy,
        "found": found,
        "acted": acted,
        "left": left,
        "closed": acted > 0 and found - left == acted,
    }


def _counts(audit: dict[str, Any], cluster: str | None) -> dict[str, Any]:
    """RocketMQ's finding counts of an mq_audit run's report, of `cluster` where it has it."""
    summary = audit.get("report", {}).get("summary", {})
    return system_summary(summary.get("clusters", {}).get(cluster, summary), ROCKETMQ)


def _count(audit: dict[str, Any], cluster: str | None, key: str, kind: str | None = None) -> int:
    """One of `_counts`: `key`'s number, or that of `kind` in `key`'s counts by kind."""
    value = _counts(audit, cluster).get(key)
    if kind is not None:
        value = (value or {}).get(kind)
    return int(value or 0)


def remediation(
    first: dict[str, Any],
    after: dict[str, Any],
    resends: list[dict[str, Any]],
    replay: dict[str, Any],
    repair: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`first` and `after`: the mq_audit summaries before and after the remedies; `resends`,
    `replay` and `repair`: the summaries of the mq_retry_resend runs (each with the `cluster`
    it resent on), of the real mq_dlq_replay and of the loss repair (with the `cluster` it
    repaired)."""
    # RocketMQ's findings of the cluster(s) each remedy acted on.
    group = replay.get("request", {}).get("group")
    resent = [run.get("cluster") for run in resends]
    replayed = replay.get("request", {}).get("cluster")

    def candidates(audit: dict[str, Any]) -> int:
        return sum(_count(audit, c, "resend_candidates") for c in resent)

    def due_elsewhere(audit: dict[str, Any]) -> dict[str, int]:
        """Per cluster the resend did not run for, its due stubs (where it has any)."""
        names = audit.get("report", {}).get("summary", {}).get("clusters", {})
        due = {c: _count(audit, c, "resend_candidates") for c in names if c not in resent}
        return {c: n for c, n in sorted(due.items()) if n}

    def stored_twice(audit: dict[str, Any]) -> int:
        return sum(_count(audit, c, "duplicates", STORED_TWICE) for c in resent)

    names = [str(c) for c in resent if c]
    where = f" of cluster{'s' * (len(names) > 1)} {', '.join(names)}" if names else ""
    loops = {
        RESEND_DUE: _loop(
            "mq_retry_resend" + where,
            candidates(first),
            sum(int(run.get("counts", {}).get("sent") or 0) for run in resends),
            candidates(after),
        )
        # A send whose answer was lost may have been stored all the same: resent, it is
        # stored twice (at-least-once). How many more the audit after finds, said with it,
        # and the due stubs of each cluster the resend did not run for.
        | {
            "stored_twice_after": max(0, stored_twice(after) - stored_twice(first)),
            "elsewhere": due_elsewhere(first),
        },
        DEAD_LETTERED: _loop(
            f"mq_dlq_replay of group {group}" if group else "mq_dlq_replay",
            _count(first, replayed, "dead_letters_waiting"),
            int(replay.get("by_status", {}).get("sent") or 0),
            _count(after, replayed, "dead_letters_waiting"),
        ),
    }
    if repair:
        lossy = repair.get("cluster")
        loops[LOST_AFTER_ACK] = _loop(
            f"mq_loss_repair of cluster {lossy}",
            _count(first, lossy, "losses", LOST_AFTER_ACK),
            int(repair.get("send", {}).get("sent") or 0),
            _count(after, lossy, "losses", LOST_AFTER_ACK),
        )
    no_remedy = {k: v for k, v in NO_REMEDY.items() if k not in loops}
    return {"loops": loops, "no_remedy": no_remedy}


def remediation_lines(r: dict[str, Any]) -> list[str]:
    """The loop as a person reads it: found -> repaired -> still found."""
    lines = [
        "repair loop (found by mq_audit -> acted on by the remedy -> found by mq_audit after):"
    ]
    for kind, loop in r["loops"].items():
        state = "closed" if loop["closed"] else "open"
        if loop.get("stored_twice_after"):
            state += (
                f"; {loop['stored_twice_after']} more stored_twice after it: sends the broker "
                "had stored, their answer lost"
            )
        if loop.get("elsewhere"):
            where = ", ".join(f"{n} in {c}" for c, n in loop["elsewhere"].items())
            state += f"; not resent: {where}, {RESEND_ELSEWHERE}"
        lines.append(
            f"  {kind:22}{loop['found']:>4} -> {loop['acted']:>4} -> {loop['left']:>4}  "
            f"({loop['remedy']}; {state})"
        )
    lines.append("  no remedy the demo runs: " + ", ".join(r["no_remedy"]))
    return lines
