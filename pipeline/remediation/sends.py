"""The sending half of a logged send run (a DLQ replay, a loss repair): paced sends with each
outcome logged, and settling unknown outcomes on the broker.

A run's messages carry its id in a property (`run_property`), so that a message an
interrupted run sent without logging it is found on the broker by UNIQ_KEY and that id
(RocketMQ). A RabbitMQ queue cannot be searched without consuming it: see
`pipeline.remediation.rabbit_sender` for what reconciling means there.
`row` turns a log entry, its new status, the reason and where the broker stored the message
into a row of the run kind's outcome table.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from broker_runtime.client.model import MQClientError
from broker_runtime.common.progress import reporter
from broker_runtime.remoting.connection import RemotingError
from pipeline.remediation.outcome_log import OutcomeLog
from pipeline.remediation.reasons import failure_reason, outcome_unknown
from pipeline.remediation.replay_plan import LogEntry, Status
from pipeline.remediation.sender import Pacer, Stored

MAX_UNKNOWN_IN_A_ROW = 5  # sends of unknown outcome in a row: the broker is away, stop

Row = Callable[[LogEntry, Status, str, Stored | None], dict[str, object]]


class Sender(Protocol):
    """What the send loop needs of a broker's client: `BrokerClient` (RocketMQ, the product's
    cluster) or `RabbitClient` (RabbitMQ). `deliver` raises MQClientError (MQBrokerError when
    the broker refused) or RemotingError; `locate` finds a send of a run on the broker, and
    `not_found` is what is logged for an in-doubt send it does not find."""

    not_found: str

    def deliver(self, msg: Any) -> tuple[str, Stored]: ...

    def locate(
        self, topic: str, msg_id: str, run_id: str, run_property: str
    ) -> tuple[str, Stored] | None: ...


class SendInterrupted(RuntimeError):
    """The send step stopped early; what it did is logged and a new attempt resumes it."""


def reconcile(
    entries: Sequence[LogEntry],
    client: Sender,
    log: OutcomeLog,
    row: Row,
    run_property: str,
) -> dict[str, int]:
    """Look each in-doubt entry up on the broker (its msg id + the entry's run id) and log
    what is true: `sent` with where it is, or `failed` with the client's `not_found`."""
    counts = {"found_sent": 0, "not_stored": 0}
    for e in entries:
        if e.topic is None:
            continue
        found = client.locate(e.topic, e.msg_id, e.replay_id, run_property)
        if found is not None:
            log.add(row(e, Status.SENT, *found))
            counts["found_sent"] += 1
        else:
            log.add(row(e, Status.FAILED, client.not_found, None))
            counts["not_stored"] += 1
    log.flush()
    return counts


def send_all(
    todo: Sequence[LogEntry],
    messages: Mapping[str, Any],
    client: Sender,
    log: OutcomeLog,
    row: Row,
    *,
    rate: float,
    missing: str,
    step: str,
    progress: bool,
) -> dict[str, int]:
    """Send `messages[e.msg_id]` for each entry at most `rate` per second and log each
    outcome; an entry without a message is logged failed with the reason `missing`.
    Raises SendInterrupted after MAX_UNKNOWN_IN_A_ROW sends in a row had no answer."""
    say = reporter(step, progress)
    counts = {"sent": 0, "failed": 0, "refused": 0}
    pacer = Pacer(rate)
    unknown_in_a_row = 0
    last_say = time.monotonic()
    for i, e in enumerate(todo):
        msg = messages.get(e.msg_id)
        if msg is None:
            log.add(row(e, Status.FAILED, f"refused: {missing}", None))
            counts["refused"] += 1
            continue
        pacer.wait()
        try:
            where, stored = client.deliver(msg)
        except (MQClientError, RemotingError) as exc:
            reason = failure_reason(exc)
            log.add(row(e, Status.FAILED, reason, None))
            counts["failed"] += 1
            unknown_in_a_row = unknown_in_a_row + 1 if outcome_unknown(reason) else 0
            if unknown_in_a_row >= MAX_UNKNOWN_IN_A_ROW:
                log.flush()
                raise SendInterrupted(
                    f"{e.replay_id}: {unknown_in_a_row} sends in a row with no answer (last: "
                    f"{exc}); stopped after {i + 1} of {len(todo)}. Run again to resume."
                ) from exc
            continue
        unknown_in_a_row = 0
        log.add(row(e, Status.SENT, where, stored))
        counts["sent"] += 1
        if time.monotonic() - last_say >= 2.0:
            last_say = time.monotonic()
            say(f"{i + 1}/{len(todo)}: {counts['sent']} sent, {counts['failed']} failed")
    say(f"done: {counts['sent']} sent, {counts['failed'] + counts['refused']} failed")
    return counts
