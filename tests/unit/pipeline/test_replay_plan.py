"""The replay's pure core: request checks, planning over the log, resume, the message sent."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from broker_runtime.common.message import (
    KEYS,
    ORIGIN_MESSAGE_ID,
    REAL_TOPIC,
    RECONSUME_TIME,
    REPLAY_ID_PROPERTY,
    REPLAY_OF_PROPERTY,
    RETRY_TOPIC,
    TAGS,
    UNIQ_KEY,
)
from pipeline.remediation.rabbit_sender import RabbitTarget, dead_letter_message
from pipeline.remediation.reasons import UNKNOWN_OUTCOME
from pipeline.remediation.replay_plan import (
    DRY_RUN_REASON,
    DeadLetter,
    LogEntry,
    Status,
    in_doubt,
    latest,
    pending,
    plan_replay,
    plan_sends,
    replay_id_for,
    replay_message,
)
from pipeline.remediation.replay_request import (
    RepairRequest,
    ReplayParamError,
    ReplayRequest,
    parse_repair_request,
    parse_request,
)
from pipeline.remediation.sender import BrokerTarget, Pacer

G = "orders-consumer"


def letters(*ids: str, topic: str | None = "orders") -> list[DeadLetter]:
    return [DeadLetter(m, G, topic, f"OFF{i}", 1000 + i) for i, m in enumerate(ids)]


def row(rid: str, msg: str, status: Status, ts: int, reason: str = "", offset: int | None = None):
    return LogEntry(rid, msg, G, "orders", status, reason, offset, ts)


def request(**kw: object) -> ReplayRequest:
    return parse_request({"group": G, "from_time": 0, "dry_run": False, **kw})


# -- the request ------------------------------------------------------------------------------


def test_defaults_are_a_dry_run_without_force() -> None:
    r = parse_request({"group": G, "msg_ids": ["A", "A", "B"]})
    assert (r.dry_run, r.force, r.max_messages, r.messages_per_second) == (True, False, 100, 50.0)
    assert r.msg_ids == ("A", "B")
    assert ReplayRequest.from_dict(r.to_dict()) == r


def test_times_as_ms_or_iso() -> None:
    r = parse_request({"group": G, "from_time": "2024-05-01T00:00:00Z", "to_time": 1714521600001})
    assert (r.from_ms, r.to_ms) == (1714521600000, 1714521600001)


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ReplayParamError) as e:
        parse_request(
            {
                "group": "%DLQ%orders-consumer",
                "topic": "bad topic",
                "from_time": "yesterday",
                "max_messages": 0,
                "messages_per_second": 0,
                "dry_run": "no",
                "colour": "red",
            }
        )
    text = str(e.value)
    for needle in (
        "unknown parameter(s) ['colour']",
        "give the consumer group (orders-consumer)",
        "topic: topic name 'bad topic'",
        "from_time: time 'yesterday'",
        "max_messages",
        "messages_per_second",
        "dry_run: true or false",
    ):
        assert needle in text
    assert len(e.value.problems) == 7


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({}, "group: required"),
        ({"group": G}, "give a time range"),
        ({"group": G, "from_time": 10, "to_time": 5}, "is after to_time"),
        ({"group": G, "msg_ids": ["a b"]}, "without spaces"),
        ({"group": G, "msg_ids": ["A"], "topic": "%RETRY%x"}, "not %RETRY%x"),
        ({"group": G, "msg_ids": ["A"], "max_messages": True}, "max_messages"),
        ({"group": G, "msg_ids": ["A"], "system": "kafka"}, "system: one of"),
        ({"group": "q.dead", "msg_ids": ["A"]}, "group: "),  # a RocketMQ group has no dots
        ({"group": "", "msg_ids": ["A"], "system": "rabbitmq"}, "the RabbitMQ queue"),
        ({"group": "q", "msg_ids": ["A"], "topic": "x" * 256, "system": "rabbitmq"}, "255"),
    ],
)
def test_bad_requests_say_why(params: dict[str, object], needle: str) -> None:
    with pytest.raises(ReplayParamError, match=None) as e:
        parse_request(params)
    assert needle in str(e.value)


def test_a_rabbitmq_request_names_a_queue_and_an_exchange() -> None:
    r = parse_request({"group": "orders.work", "topic": "", "from_time": 0, "system": "rabbitmq"})
    assert (r.group, r.topic, r.system, r.dry_run) == ("orders.work", "", "rabbitmq", True)
    assert ReplayRequest.from_dict(r.to_dict()) == r
    assert "RabbitMQ queue orders.work, exchange ''" in r.describe()


def test_a_rabbitmq_dead_letter_goes_back_by_its_newest_death() -> None:
    death = json.dumps(
        [
            {"queue": "work", "reason": "rejected", "exchange": "orders", "count": 1,
             "routing-keys": ["to.work", "audit"]},
            {"queue": "first", "reason": "expired", "exchange": "old", "routing-keys": ["k"]},
        ]
    )  # fmt: skip
    msg = dead_letter_message("M1", b"b", death, '{"tenant": "t1"}', "r1", "dead#7")
    assert (msg.exchange, msg.routing_key, msg.msg_id, msg.body) == (
        "orders",
        "to.work",
        "M1",
        b"b",
    )
    assert msg.headers == {
        "tenant": "t1", "CC": ["audit"], REPLAY_ID_PROPERTY: "r1", REPLAY_OF_PROPERTY: "dead#7"
    }  # fmt: skip
    with pytest.raises(ValueError, match="JSON object"):
        dead_letter_message("M1", b"b", death, "[1]", "r1", "dead#7")


# -- planning ---------------------------------------------------------------------------------


def test_a_first_plan_plans_up_to_max_and_counts_the_rest() -> None:
    plan = plan_replay("r1", request(max_messages=2), letters("A", "B", "C"), [], 5)
    assert [e.msg_id for e in plan.planned] == ["A", "B"]
    assert plan.left_over == 1 and plan.new
    assert all(e.status is Status.PLANNED and e.ts == 5 for e in plan.rows)


def test_a_dry_plan_is_marked_and_never_pending() -> None:
    plan = plan_replay("r1", request(dry_run=True), letters("A"), [], 5)
    assert plan.planned[0].reason == DRY_RUN_REASON
    assert pending("r1", plan.rows) == [] and in_doubt(plan.rows) == []


def test_a_message_sent_before_is_skipped_unless_forced() -> None:
    log = [row("r0", "A", Status.PLANNED, 1), row("r0", "A", Status.SENT, 2, offset=7)]
    plan = plan_replay("r1", request(), letters("A", "B"), log, 5)
    assert [e.msg_id for e in plan.planned] == ["B"]
    (skip,) = plan.skipped
    assert skip.msg_id == "A" and "already replayed (by r0, offset 7" in (skip.reason or "")
    forced = plan_replay("r2", request(force=True), letters("A", "B"), log, 5)
    assert [e.msg_id for e in forced.planned] == ["A", "B"]


def test_skipped_messages_do_not_count_against_max() -> None:
    log = [row("r0", "A", Status.SENT, 2, offset=7)]
    plan = plan_replay("r1", request(max_messages=1), letters("A", "B", "C"), log, 5)
    assert [e.msg_id for e in plan.planned] == ["B"] and plan.left_over == 1


def test_a_replay_id_plans_once() -> None:
    first = plan_replay("r1", request(), letters("A", "B"), [], 5)
    log = [*first.rows, row("r1", "A", Status.SENT, 6, offset=1)]
    again = plan_replay("r1", request(), letters("A", "B", "C"), log, 9)
    assert not again.new and again.rows == []
    assert {e.msg_id: e.status for e in again.planned} == {"A": Status.SENT, "B": Status.PLANNED}


def test_unknown_outcomes_of_other_runs_block_planning() -> None:
    log = [
        row("r0", "A", Status.PLANNED, 1, "to send"),
        row("r0", "B", Status.FAILED, 2, f"{UNKNOWN_OUTCOME}: timed out"),
        row("r0", "C", Status.FAILED, 2, "refused: no such topic"),
        row("rd", "D", Status.PLANNED, 1, DRY_RUN_REASON),
    ]
    assert [e.msg_id for e in in_doubt(log)] == ["A", "B"]
    plan = plan_replay("r1", request(), letters("A", "B", "C", "D"), log, 5)
    assert [e.msg_id for e in plan.planned] == ["C", "D"]
    assert all("outcome unknown in r0" in (e.reason or "") for e in plan.skipped)


def test_resume_sends_what_is_planned_or_failed_never_what_was_sent() -> None:
    log = [
        row("r1", "A", Status.PLANNED, 1, "to send"),
        row("r1", "B", Status.PLANNED, 1, "to send"),
        row("r1", "C", Status.PLANNED, 1, "to send"),
        row("r1", "A", Status.SENT, 2, offset=3),
        row("r1", "B", Status.FAILED, 2, "refused: busy"),
        row("r2", "D", Status.PLANNED, 1, "to send"),
    ]
    assert [e.msg_id for e in pending("r1", log)] == ["C", "B"]


def test_the_latest_row_wins_and_sent_wins_a_tie() -> None:
    log = [row("r", "A", Status.SENT, 5, offset=1), row("r", "A", Status.PLANNED, 5, "to send")]
    assert latest(log)[("r", "A")].status is Status.SENT


@pytest.mark.parametrize("topic", [None, "%DLQ%g", "%RETRY%g"])
def test_a_dead_letter_without_original_topic_is_skipped(topic: str | None) -> None:
    plan = plan_replay("r1", request(), letters("A", topic=topic), [], 5)
    assert plan.planned == [] and "no original topic" in (plan.skipped[0].reason or "")


def test_replay_ids_are_stable_per_run() -> None:
    assert replay_id_for("mq_dlq_replay", "run1") == replay_id_for("mq_dlq_replay", "run1")
    assert replay_id_for("mq_dlq_replay", "run1") != replay_id_for("mq_dlq_replay", "run2")


# -- the message ------------------------------------------------------------------------------


def test_the_replayed_message_keeps_the_original_and_drops_retry_bookkeeping() -> None:
    props = {
        UNIQ_KEY: "U1",
        KEYS: "order-1",
        TAGS: "paid",
        "app": "x",
        RETRY_TOPIC: "orders",
        ORIGIN_MESSAGE_ID: "OFF",
        REAL_TOPIC: "%RETRY%g",
        RECONSUME_TIME: "16",
    }
    msg = replay_message("orders", b"body", props, "U1", "r1", "DLQOFF")
    assert msg.topic == "orders" and msg.body == b"body"
    assert msg.properties == {
        UNIQ_KEY: "U1",
        KEYS: "order-1",
        TAGS: "paid",
        "app": "x",
        REPLAY_ID_PROPERTY: "r1",
        REPLAY_OF_PROPERTY: "DLQOFF",
    }


def test_pacer_spaces_calls() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    pacer = Pacer(4.0, clock=lambda: now[0], sleep=sleep)
    for _ in range(3):
        pacer.wait()
    assert slept == [0.25, 0.25]
    with pytest.raises(ValueError):
        Pacer(0)


# -- a loss repair: the same rules, no group, its own refusals -----------------------------


def test_a_repair_request_is_a_dry_run_by_default_and_says_what_is_wrong() -> None:
    r = parse_repair_request({"msg_ids": "L1, L2"})
    assert (r.msg_ids, r.dry_run, r.force, r.max_messages) == (("L1", "L2"), True, False, 100)
    assert r.cluster is None  # the data dir's cluster
    assert RepairRequest.from_dict(r.to_dict()) == r
    assert parse_repair_request({"cluster": "crash_async"}).cluster == "crash_async"
    with pytest.raises(ReplayParamError) as e:
        parse_repair_request(
            {"group": G, "messages_per_second": 0, "force": "yes", "cluster": "no such!"}
        )
    text = str(e.value)
    assert "unknown parameter(s) ['group']" in text
    assert "messages_per_second" in text and "force: true or false" in text
    assert "cluster: " in text


def test_a_repair_plan_skips_the_unrepairable_and_what_some_repair_sent() -> None:
    @dataclass(frozen=True)
    class Loss:
        msg_id: str
        topic: str = "orders"
        group: str | None = None

    losses = [Loss(m) for m in ("L1", "L2", "L3")]
    log = [LogEntry("p0", "L3", None, "orders", Status.SENT, "stored", 9, 2)]
    plan = plan_sends(
        "p1", losses, log, 5, dry_run=False, force=False, max_messages=10,
        unsendable={"L2": "not repairable: no body"}, done="already repaired",
    )  # fmt: skip
    assert [e.msg_id for e in plan.planned] == ["L1"]
    assert {e.msg_id: e.reason for e in plan.skipped} == {
        "L2": "not repairable: no body",
        "L3": "already repaired (by p0, offset 9, at 2; force=true to send again)",
    }


def test_a_replay_sends_only_to_its_own_system() -> None:
    from pipeline.jobs.replay import _client

    with pytest.raises(ValueError, match="a rabbitmq replay cannot send to BrokerTarget"):
        _client(request(system="rabbitmq"), BrokerTarget("127.0.0.1:9876"))
    with pytest.raises(ValueError, match="a rocketmq replay cannot send to RabbitTarget"):
        _client(request(), RabbitTarget("amqp://guest:guest@127.0.0.1:5672/%2F"))
