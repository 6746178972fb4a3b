"""What tests/interop/test_our_clients.py holds each message to: mqaudit's clients on one
side, Apache RocketMQ's official client or mqadmin on the other, every field compared."""

from __future__ import annotations

import asyncio
import json
import subprocess
from typing import Any

from broker_runtime.client.consume_service import ConsumeContext
from broker_runtime.client.model import (
    ConsumeFromWhere,
    ConsumeStatus,
    ReceivedMessage,
    SendResult,
    new_message,
)
from broker_runtime.common.message import UNIQ_KEY, Message, decode_offset_msg_id
from tests.conftest import mqaudit_cmd
from tests.interop.rocketmq import mqadmin

FIRST = ConsumeFromWhere.FIRST_OFFSET
# What Apache RocketMQ adds to what a producer sent: the broker its cluster's name; the
# official consumer, in memory, the queue's offsets at pull time and when consuming began.
BROKER_ADDS = {"CLUSTER"}
JAVA_CONSUMER_ADDS = {"MIN_OFFSET", "MAX_OFFSET", "CONSUME_START_TIME"}
DELAY_ADDS = {"REAL_TOPIC", "REAL_QID"}  # a delayed message, back from SCHEDULE_TOPIC_XXXX


def ours(topic: str, i: int, **kw: Any) -> Message:
    """Message i as mqaudit's producers send it."""
    return new_message(
        topic,
        f"body-{i}".encode(),
        tags="TagA" if i % 2 else "TagB",
        keys=[f"k-{i}", "ours"],
        properties={"color": "red", "n": str(i)},
        **kw,
    )


def nth(batch: SendResult, k: int) -> SendResult:
    """The k-th message's part of a batch's result: Apache RocketMQ's broker answers every
    message's offset id, comma-separated, as the official client's SendResult keeps them."""
    offset_ids = batch.offset_msg_id.split(",")
    assert len(offset_ids) == len(batch.msg_ids)
    return SendResult(
        batch.status, batch.msg_ids[k], offset_ids[k], batch.mq, batch.queue_offset + k
    )


def check_seen_by_java(
    row: dict[str, Any],
    sent: Message,
    result: SendResult | None,
    adds: set[str] = BROKER_ADDS | JAVA_CONSUMER_ADDS,
) -> None:
    """One message as the official consumer got it, against what ours sent and were told;
    `adds`: the properties the broker and that consumer add."""
    props = row["properties"]
    assert row["body"] == sent.body.decode()
    assert row["msgId"] == props[UNIQ_KEY] == sent.properties[UNIQ_KEY]
    assert (row["keys"], row["tags"]) == (sent.properties["KEYS"], sent.properties["TAGS"])
    delayed = DELAY_ADDS if "DELAY" in sent.properties else set()
    assert set(props) == set(sent.properties) | adds | delayed
    assert {k: props[k] for k in sent.properties} == sent.properties
    assert props["CLUSTER"] == "interop"
    if result is None:  # one-way: nothing was said back
        return
    assert row["queueId"] == result.mq.queue_id
    if "DELAY" in sent.properties:  # the answer's offset is SCHEDULE_TOPIC_XXXX's
        assert props["REAL_TOPIC"] == sent.topic and props["DELAY"] == sent.properties["DELAY"]
        assert row["storeTimestamp"] - row["bornTimestamp"] >= 900  # delay level 2: 1 s here
    else:
        assert row["queueOffset"] == result.queue_offset
        assert decode_offset_msg_id(result.offset_msg_id)[1] == row["commitLogOffset"]


def mqaudit_out(*args: str) -> str:
    """Run the mqaudit CLI to its end; what it printed on stdout."""
    done = subprocess.run(mqaudit_cmd(*args), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def mqaudit(*args: str) -> Any:
    """The JSON of the last line mqaudit printed."""
    return json.loads(mqaudit_out(*args).splitlines()[-1])


def check_seen_by_ours(m: ReceivedMessage, ack: dict[str, Any], topic: str) -> None:
    """One message of the official producer (--tags TagA --keys k --prop color=red) as one
    of ours got it, against what the official producer was told."""
    i = ack["i"]
    assert (m.topic, m.body, m.keys, m.tags) == (topic, f"body-{i}".encode(), f"k-{i}", "TagA")
    assert m.msg_id == m.uniq_key == ack["msgId"]
    assert m.offset_msg_id == ack["offsetMsgId"]
    assert (m.queue_id, m.queue_offset) == (ack["queueId"], ack["queueOffset"])
    assert m.properties == {  # (the broker does not store the client's WAIT=true)
        UNIQ_KEY: ack["msgId"],
        "KEYS": f"k-{i}",
        "TAGS": "TagA",
        "color": "red",
        "CLUSTER": "interop",
    }


def check_ours_seen_by_ours(m: ReceivedMessage, sent: Message, result: SendResult) -> None:
    assert (m.topic, m.body, m.msg_id) == (sent.topic, sent.body, result.msg_id)
    assert m.properties == {**sent.properties, "CLUSTER": "interop"}
    assert (m.queue_id, m.queue_offset) == (result.mq.queue_id, result.queue_offset)


def consumer_progress(ns: str, group: str) -> dict[tuple[str, int], tuple[int, int]]:
    """mqadmin consumerProgress: (topic, queue) -> (broker offset, consumer offset)."""
    return progress_table(mqadmin(ns, "consumerProgress", "-g", group))


def progress_table(out: str) -> dict[tuple[str, int], tuple[int, int]]:
    """The rows of a consumer progress table (mqadmin's or `mqaudit admin`'s: topic,
    broker, queue, broker offset, consumer offset, diff, last time)."""
    rows = [line.split() for line in out.splitlines()]
    table = {
        (r[0], int(r[2])): (int(r[3]), int(r[4])) for r in rows if len(r) >= 6 and r[2].isdigit()
    }
    assert table, out
    return table


class Got:
    """What one of our consumers was handed, in order; `wait` until it has `n`."""

    def __init__(self) -> None:
        self.msgs: list[ReceivedMessage] = []
        self.changed = asyncio.Event()

    async def listener(self, msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeStatus:
        self.add(msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    def add(self, msgs: list[ReceivedMessage]) -> None:
        self.msgs += msgs
        self.changed.set()

    async def wait(self, n: int, timeout_s: float = 60.0) -> None:
        async with asyncio.timeout(timeout_s):
            while len(self.msgs) < n:
                await self.changed.wait()
                self.changed.clear()
