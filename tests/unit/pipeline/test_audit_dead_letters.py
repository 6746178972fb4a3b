"""audit_dead_letters on hand-built rows: retry chains, deliveries, replays, age."""

from __future__ import annotations

import json

import pytest
from pyspark.sql import Row, SparkSession

from pipeline.transforms.dead_letters import audit_dead_letters
from pipeline.transforms.rabbit import rabbit_dead_letters
from tests.unit.pipeline.audit_helpers import (
    T0,
    assert_rows,
    delivery,
    log,
    messages,
    msg,
    replays,
)

pytestmark = pytest.mark.slow

RETRY = {"topic": "%RETRY%g1", "is_retry": True, "consumer_group": "g1"}
DLQ = {"topic": "%DLQ%g1", "is_dlq": True, "consumer_group": "g1"}
WAITING = {"topic": "SCHEDULE_TOPIC_XXXX", "is_scheduled": True, "is_retry": True}


def test_dead_letters_with_chain_deliveries_and_replays(spark: SparkSession) -> None:
    commitlog = [
        msg(0, "D1", 0),
        msg(200, "D1", 0, **WAITING, reconsume_times=1, consumer_group="g1"),
        msg(400, "D1", 0, **RETRY, reconsume_times=1, store_ts=T0 + 10_000),
        msg(600, "D1", 1, **RETRY, reconsume_times=2, store_ts=T0 + 30_000),
        *[
            msg(800, "D1", 0, **DLQ, reconsume_times=3, store_ts=T0 + 60_000, broker_id=b)
            for b in (0, 1)
        ],
        msg(1000, "D2", 1),
        msg(1200, "D2", 1, **DLQ, reconsume_times=1, store_ts=T0 + 70_000),
        msg(1400, "R1", 2),  # retried, then consumed: no dead letter
        msg(1600, "R1", 2, **RETRY, reconsume_times=1),
    ]
    deliveries = [
        delivery(1, "D1", outcome="RECONSUME_LATER"),
        delivery(2, "D1", topic="%RETRY%g1", reconsume_times=1, outcome="RECONSUME_LATER"),
        delivery(3, "D1", topic="%RETRY%g1", reconsume_times=2, outcome="FAILED"),
    ]
    replay_log = [
        {"replay_id": "r1", "msg_id": "D2", "group": "g1", "status": "planned", "ts": T0 + 80_000},
        {"replay_id": "r1", "msg_id": "D2", "group": "g1", "status": "sent", "ts": T0 + 81_000},
        {"replay_id": "r2", "msg_id": "D1", "group": "g2", "status": "sent", "ts": T0 + 81_000},
    ]
    as_of = T0 + 100_000
    df = audit_dead_letters(
        messages(spark, commitlog), log(spark, deliveries), replays(spark, replay_log), as_of
    )
    cols = ["msg_id", "group", "kind", "cause", "count", "topic", "original_topic", "first_ts"]
    cols += ["last_ts", "age_ms", "retries", "deliveries", "last_outcome", "replayed"]
    cols += ["replay_status", "replayed_at", "as_of_ms"]
    assert_rows(
        df,
        cols,
        [
            (
                "D1",
                "g1",
                "dead_lettered",
                "max_reconsume_times",
                3,
                "%DLQ%g1",
                "TopicA",
                T0,
                T0 + 60_000,
                40_000,
                2,
                3,
                "FAILED",
                False,
                None,
                None,
                as_of,
            ),
            (
                "D2",
                "g1",
                "dead_lettered",
                "sent_to_dlq_directly",
                1,
                "%DLQ%g1",
                "TopicA",
                T0 + 1000,
                T0 + 70_000,
                30_000,
                0,
                0,
                None,
                True,
                "sent",
                T0 + 81_000,
                as_of,
            ),
        ],
    )
    chains = {r["msg_id"]: r["retry_chain"] for r in df.select("msg_id", "retry_chain").collect()}
    assert chains == {
        "D1": [
            Row(reconsume_times=1, store_ts=T0 + 10_000, broker="broker-a", queue_offset=0),
            Row(reconsume_times=2, store_ts=T0 + 30_000, broker="broker-a", queue_offset=1),
        ],
        "D2": [],
    }


def test_rabbitmq_dead_letters_are_marked_by_rabbitmq_replays(spark: SparkSession) -> None:
    death = json.dumps(
        [{"queue": "work", "reason": "rejected", "exchange": "orders", "routing-keys": ["k"],
          "count": 1}]
    )  # fmt: skip
    dead = {"system": "rabbitmq", "group": "dead", "topic": "dlx", "broker": "vh", "death": death}
    deliveries = [delivery(1, "M1", **dead), delivery(2, "M2", **dead)]
    replay_log = [
        {"replay_id": "r1", "msg_id": "M1", "group": "work", "status": "sent",
         "ts": T0 + 5_000, "system": "rabbitmq"},
        # A RocketMQ replay of a group named like the queue: not this dead letter's.
        {"replay_id": "r2", "msg_id": "M2", "group": "work", "status": "sent", "ts": T0 + 5_000},
    ]  # fmt: skip
    df = rabbit_dead_letters(log(spark, deliveries), T0 + 100_000, replays(spark, replay_log))
    assert_rows(
        df,
        ["msg_id", "group", "cause", "original_topic", "replayed", "replay_status", "replayed_at"],
        [
            ("M1", "work", "rejected", "orders", True, "sent", T0 + 5_000),
            ("M2", "work", "rejected", "orders", False, None, None),
        ],
    )
