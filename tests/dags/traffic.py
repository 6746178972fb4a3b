"""Traffic for the remediation tests on a real cluster: messages, dead letters, lookups.

Dead letters are stored the way the broker stores a message it gives up on (seed 003,
`send_back_message`): a copy in `%DLQ%{group}` keeping every property of the original
(UNIQ_KEY, KEYS, TAGS) plus RETRY_TOPIC (the original topic), ORIGIN_MESSAGE_ID and the
reconsume count. They are sent through the product's producer straight to the DLQ topic,
so that a test needs no consumer to fail 16 times first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from broker_runtime.client.admin import MQAdmin
from broker_runtime.client.model import ReceivedMessage, new_message
from broker_runtime.client.producer import Producer
from broker_runtime.client.sync import SyncProducer
from broker_runtime.common import aio
from broker_runtime.common.message import (
    ORIGIN_MESSAGE_ID,
    RECONSUME_TIME,
    REPLAY_ID_PROPERTY,
    RETRY_TOPIC,
)
from broker_runtime.common.topics import dlq_topic


def send_messages(namesrv: str, topic: str, count: int, tag: str = "t") -> list[str]:
    """`count` ordinary messages; their UNIQ_KEYs (also creates the topic)."""
    with SyncProducer(Producer(namesrv, "remediation-test-producer")) as p:
        return [
            p.send(new_message(topic, f"{tag}-{i}".encode(), tags=tag, keys=f"{tag}-{i}")).msg_id
            for i in range(count)
        ]


def make_dead_letters(namesrv: str, group: str, topic: str, count: int) -> list[str]:
    """`count` dead letters of `group` first sent to `topic`; their UNIQ_KEYs, oldest first."""
    send_messages(namesrv, topic, 1, tag="create")  # the original topic must exist
    ids = []
    with SyncProducer(Producer(namesrv, "remediation-test-producer")) as p:
        for i in range(count):
            original = new_message(topic, f"{group}-{i}".encode(), tags="dead", keys=f"k{i}")
            original.properties[RETRY_TOPIC] = topic
            original.properties[RECONSUME_TIME] = "16"
            original.properties[ORIGIN_MESSAGE_ID] = f"ORIGIN-{group}-{i}"
            original.topic = dlq_topic(group)
            ids.append(p.send(original).msg_id)
    return ids


def copies_on_broker(namesrv: str, topic: str, msg_id: str) -> list[ReceivedMessage]:
    """Every message of `topic` with this UNIQ_KEY, by the brokers' key index."""

    async def query() -> list[ReceivedMessage]:
        async with MQAdmin(namesrv) as admin:
            found = await admin.query_by_key(topic, msg_id)
        return [m for m in found if m.msg_id == msg_id]

    result: list[ReceivedMessage] = aio.run(query())
    return result


def replays_on_broker(namesrv: str, topic: str, msg_id: str) -> list[ReceivedMessage]:
    return [
        m for m in copies_on_broker(namesrv, topic, msg_id) if REPLAY_ID_PROPERTY in m.properties
    ]


def ingest(spark: Any, data_dir: Path, lake: Path) -> dict[str, Any]:
    from pipeline.jobs.ingest import run_ingest

    summary: dict[str, Any] = run_ingest(data_dir, lake, spark, progress=False)
    return summary


def replay_log(spark: Any, lake: Path) -> list[dict[str, Any]]:
    from pipeline.delta_io import DeltaIO
    from pipeline.lake import DLQ_REPLAY_LOG

    df = DeltaIO(spark).read(DLQ_REPLAY_LOG.path(lake), DLQ_REPLAY_LOG.schema)
    return [r.asDict() for r in df.collect()]
