"""The resend's core: which candidates are still due, and how each stub is updated (send
count, back-off, new offset, VOID at the max) in a real SQLite producer ledger."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from broker_runtime.client.model import MQClientError, SendResult, SendStatus
from broker_runtime.client.rebalance import MessageQueue
from broker_runtime.common.clock import FakeClock
from broker_runtime.common.message import KEYS, RETRY_TOPIC, TAGS, UNIQ_KEY, Message
from broker_runtime.ledger.producer import ProducerLedger, ResendBackoff, StubRecord, body_hash
from pipeline.jobs.resend import _Run
from pipeline.remediation.resend_bodies import Body
from pipeline.remediation.resend_plan import (
    RESEND_RUN_PROPERTY,
    Action,
    Candidate,
    Decision,
    plan_resend,
    resend_message,
    resend_rabbit_message,
)
from pipeline.remediation.sender import BrokerClient

NOW = 1_700_000_000_000
BACKOFF = ResendBackoff(first_ms=1_000, factor=2.0, max_ms=60_000)


def cand(msg_id: str, count: int = 1) -> Candidate:
    return Candidate(msg_id, "orders", "paid", f"key-{msg_id}", body_hash(msg_id.encode()), count)


def stub(status: str = "UNCONFIRMED", count: int = 1, due: int | None = NOW) -> dict[str, Any]:
    return {"status": status, "send_count": count, "next_resend_at": due}


def test_a_candidate_still_due_is_sent() -> None:
    plan = plan_resend([cand("A")], [], {"A": stub()}, [], 16, NOW)
    assert plan.to_send == [cand("A")] and plan.decided == []


@pytest.mark.parametrize(
    ("live", "consumed", "reason"),
    [
        (None, [], "stub no longer in the producer ledger"),
        (stub("CONFIRMED"), [], "stub is CONFIRMED now"),
        (stub("VOID"), [], "stub is VOID now"),
        (stub(count=2), [], "resent since the audit (send count 1 -> 2)"),
        (stub(due=NOW + 1), [], f"not due before {NOW + 1}"),
        (stub(), ["A"], "consumed since the audit"),
    ],
)
def test_what_changed_since_the_audit_is_skipped(
    live: dict[str, Any] | None, consumed: list[str], reason: str
) -> None:
    stubs = {} if live is None else {"A": live}
    plan = plan_resend([cand("A")], [], stubs, consumed, 16, NOW)
    assert plan.to_send == []
    assert [(d.action, d.reason) for d in plan.decided] == [(Action.SKIPPED, reason)]


def test_stubs_at_the_max_go_to_a_person() -> None:
    plan = plan_resend(
        [cand("A", 3)],
        [cand("B", 3), cand("C", 3)],
        {"A": stub(count=3), "B": stub(count=3), "C": stub("VOID", 3)},
        [],
        3,
        NOW,
    )
    assert plan.to_send == []
    assert [(d.candidate.msg_id, d.action) for d in plan.decided] == [
        ("A", Action.MANUAL),
        ("B", Action.MANUAL),
        ("C", Action.SKIPPED),
    ]
    assert [d.candidate.msg_id for d in plan.manual] == ["A", "B"]


def test_the_resent_message_keeps_its_id_tags_and_keys() -> None:
    msg = resend_message(cand("A"), b"A", {RETRY_TOPIC: "orders", "app": "1", UNIQ_KEY: "X"})
    assert msg.topic == "orders" and msg.body == b"A"
    assert msg.properties == {"app": "1", UNIQ_KEY: "A", TAGS: "paid", KEYS: "key-A"}


# -- stub updates in a real ledger ------------------------------------------------------------


class FakeLog:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)


class Client:
    """Answers sends like a broker would, or fails them (a broker that is away)."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.sent: list[Message] = []

    deliver = BrokerClient.deliver

    def send(self, msg: Message) -> SendResult:
        if self.fail:
            raise MQClientError("send to orders failed after 1 attempt(s): broker-a: timed out")
        self.sent.append(msg)
        mq = MessageQueue(msg.topic, "broker-a", 2)
        return SendResult(SendStatus.SEND_OK, msg.properties[UNIQ_KEY], "OFF", mq, 41)


@pytest.fixture
def ledger(tmp_path: Path) -> ProducerLedger:
    clock = FakeClock(NOW)
    led = ProducerLedger.open(tmp_path, clock=clock, backoff=BACKOFF)
    msgs = [Message("orders", m.encode(), {UNIQ_KEY: m}) for m in ("A", "B")]
    led.record_before_send([StubRecord.of(m) for m in msgs])
    led.keep_bodies(msgs)
    return led


def run_of(ledger: ProducerLedger, max_send_count: int = 16) -> tuple[_Run, FakeLog]:
    log = FakeLog()
    return _Run(ledger, log, "run-1", max_send_count, "c1"), log  # type: ignore[arg-type]


def test_kept_bodies_come_back_by_id(ledger: ProducerLedger) -> None:
    assert ledger.bodies(["A", "B", "Z"]) == {"A": b"A", "B": b"B"}
    ledger.keep_bodies([Message("orders", b"other", {UNIQ_KEY: "A"})])  # kept once
    assert ledger.bodies(["A"]) == {"A": b"A"}
    with pytest.raises(ValueError, match="no UNIQ_KEY"):
        ledger.keep_bodies([Message("orders", b"x")])


def test_an_acknowledged_resend_confirms_the_stub_at_its_new_offset(ledger: ProducerLedger) -> None:
    run, log = run_of(ledger)
    client = Client()
    run.resend(cand("A"), Body(b"A", None, "producer ledger"), client)  # type: ignore[arg-type]
    row = ledger.get("A")
    assert row is not None
    assert (row["status"], row["send_count"], row["next_resend_at"]) == ("CONFIRMED", 2, None)
    assert (row["broker"], row["queue_id"], row["queue_offset"]) == ("broker-a", 2, 41)
    assert client.sent[0].properties[UNIQ_KEY] == "A"
    (entry,) = log.rows
    assert entry["action"] == "sent" and entry["new_offset"] == 41 and entry["send_count"] == 2


def test_a_resend_without_answer_backs_the_stub_off(ledger: ProducerLedger) -> None:
    run, log = run_of(ledger)
    run.resend(cand("A"), Body(b"A", None, "producer ledger"), Client(fail=True))  # type: ignore[arg-type]
    row = ledger.get("A")
    assert row is not None
    assert (row["status"], row["send_count"]) == ("UNCONFIRMED", 2)
    assert row["next_resend_at"] == NOW + BACKOFF.delay_ms(2)  # 2 s after the second send
    assert log.rows[0]["action"] == "failed"
    assert log.rows[0]["reason"].startswith("unknown outcome: send to orders failed")


def test_a_failed_last_send_hands_the_stub_to_a_person(ledger: ProducerLedger) -> None:
    run, log = run_of(ledger, max_send_count=2)
    run.resend(cand("A"), Body(b"A", None, "producer ledger"), Client(fail=True))  # type: ignore[arg-type]
    row = ledger.get("A")
    assert row is not None and (row["status"], row["send_count"]) == ("VOID", 2)
    assert [r["action"] for r in log.rows] == ["manual"]
    assert run.manual[0]["msg_id"] == "A" and "at max" in run.manual[0]["reason"]


def test_handing_over_voids_and_lists(ledger: ProducerLedger) -> None:
    run, _ = run_of(ledger)
    run.hand_over([Decision(cand("B"), Action.MANUAL, "send count 16 at max")])
    row = ledger.get("B")
    assert row is not None and row["status"] == "VOID"
    assert run.manual == [
        {
            "msg_id": "B",
            "topic": "orders",
            "tags": "paid",
            "keys": "key-B",
            "body_hash": body_hash(b"B"),
            "send_count": 1,
            "reason": "send count 16 at max",
        }
    ]
    assert run.counts["manual"] == 1


def test_a_rabbitmq_stub_goes_back_to_its_exchange_and_key_with_its_headers() -> None:
    c = Candidate.of({**vars(cand("A")), "system": "rabbitmq"})
    assert c.rabbitmq and not cand("A").rabbitmq
    live = {"routing_key": "to.work", "headers": '{"tenant": "t1"}'}
    msg = resend_rabbit_message(c, live, b"A", "run-1")
    assert (msg.exchange, msg.routing_key, msg.msg_id, msg.body) == ("orders", "to.work", "A", b"A")
    assert msg.headers == {"tenant": "t1", RESEND_RUN_PROPERTY: "run-1"}
    bare = resend_rabbit_message(c, {"routing_key": None, "headers": None}, b"A", "run-1")
    assert (bare.routing_key, bare.headers) == ("", {RESEND_RUN_PROPERTY: "run-1"})
