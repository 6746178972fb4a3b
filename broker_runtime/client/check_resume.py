"""Put a transaction the check-back gave up on back under checking (`mqaudit admin
resume-check`).

After transactionCheckMax checks the broker moves a half message to TRANS_CHECK_MAX_TIME_TOPIC
and never asks about it again. Resuming sends it once more as a half message (TRAN_MSG,
PREPARED sysflag, its UNIQ_KEY and producer group kept) to its real topic and queue on the
broker that gave up on it, with TRANSACTION_CHECK_TIMES dropped: the broker parks it in
RMQ_SYS_TRANS_HALF_TOPIC again, and after transactionTimeOut the check-back asks a producer
of its group, from a check count of zero. The send goes through the broker's ordinary half
message path, so the new half message is stored exactly as a producer's would be.

A message that is already back under checking (a half message with its UNIQ_KEY stored on
that broker after the give-up) is refused unless forced: two half messages of one
transaction can both be committed.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker_runtime.client.admin import MQAdmin
from broker_runtime.client.config import ClientConfig
from broker_runtime.client.model import ReceivedMessage, SendStatus
from broker_runtime.client.producer import Producer
from broker_runtime.client.rebalance import MessageQueue
from broker_runtime.common.message import (
    PRODUCER_GROUP,
    REAL_QUEUE_ID,
    REAL_TOPIC,
    TRANSACTION_CHECK_TIMES,
    TRANSACTION_PREPARED_TYPE,
    Message,
    StoredMessage,
    with_transaction_type,
)
from broker_runtime.common.topics import TRANS_CHECK_MAX_TIME_TOPIC, TRANS_HALF_TOPIC

# The group the resuming producer sends as: never a transaction's own group, so that the
# broker's check-back cannot pick this short-lived producer to ask.
RESUME_GROUP = "CID_MQAUDIT_RESUME_CHECK"


class ResumeError(ValueError):
    """The message cannot be resumed; the text says why (nothing was sent)."""


@dataclass(frozen=True)
class Resumed:
    msg_id: str
    broker: str
    topic: str
    queue_id: int
    producer_group: str
    checks_before: int
    half_queue_offset: int  # of the new half message in RMQ_SYS_TRANS_HALF_TOPIC


def resumed_half(gave_up: StoredMessage) -> Message:
    """The half message a resume sends: the given-up one, its check count gone."""
    props = dict(gave_up.properties)
    topic, queue = props.pop(REAL_TOPIC, None), props.pop(REAL_QUEUE_ID, None)
    if topic is None or queue is None or not queue.isdigit():
        raise ResumeError(f"{gave_up.uniq_key}: no REAL_TOPIC / REAL_QID: not a half message")
    props.pop(TRANSACTION_CHECK_TIMES, None)
    return Message(
        topic=topic,
        body=gave_up.body,
        properties=props,
        queue_id=int(queue),
        flag=gave_up.flag,
        sys_flag=with_transaction_type(gave_up.sys_flag, TRANSACTION_PREPARED_TYPE),
    )


async def _copies(admin: MQAdmin, topic: str, msg_id: str) -> list[ReceivedMessage]:
    try:
        found = await admin.query_by_key(topic, msg_id)
    except Exception:  # a topic no name server routes yet: nothing stored there
        return []
    return [m for m in found if m.uniq_key == msg_id]


def _plan(
    gave_up: list[ReceivedMessage], halves: list[ReceivedMessage], force: bool
) -> list[ReceivedMessage]:
    """Per broker, the newest given-up copy, unless a half message came after it."""
    newest: dict[str, ReceivedMessage] = {}
    for m in gave_up:
        if m.broker not in newest or m.msg.store_timestamp > newest[m.broker].msg.store_timestamp:
            newest[m.broker] = m
    for broker, m in newest.items():
        later = [
            h
            for h in halves
            if h.broker == broker and h.msg.store_timestamp > m.msg.store_timestamp
        ]
        if later and not force:
            raise ResumeError(
                f"{m.msg_id} is already back under checking on {broker} (half message at "
                f"queue offset {later[-1].msg.queue_offset}); --force to send it again"
            )
    return [newest[b] for b in sorted(newest)]


async def resume_check(
    config: ClientConfig | str, msg_id: str, force: bool = False
) -> list[Resumed]:
    """Resume the check of the given-up transaction `msg_id` (UNIQ_KEY) on every broker that
    gave up on it."""
    async with MQAdmin(config) as admin:
        gave_up = await _copies(admin, TRANS_CHECK_MAX_TIME_TOPIC, msg_id)
        if not gave_up:
            raise ResumeError(f"{msg_id} is not in {TRANS_CHECK_MAX_TIME_TOPIC} on any broker")
        chosen = _plan(gave_up, await _copies(admin, TRANS_HALF_TOPIC, msg_id), force)
    out = []
    producer = Producer(config, RESUME_GROUP)
    await producer.start()
    try:
        for m in chosen:
            half = resumed_half(m.msg)
            mq = MessageQueue(half.topic, m.broker, half.queue_id)
            r = await producer.send_to_queue(half, mq)
            if r.status is not SendStatus.SEND_OK:
                raise ResumeError(f"{msg_id}: {m.broker} answered {r.status.value}")
            out.append(
                Resumed(
                    msg_id=msg_id,
                    broker=m.broker,
                    topic=half.topic,
                    queue_id=half.queue_id,
                    producer_group=half.properties.get(PRODUCER_GROUP, ""),
                    checks_before=int(m.msg.properties.get(TRANSACTION_CHECK_TIMES, "0") or 0),
                    half_queue_offset=r.queue_offset,
                )
            )
    finally:
        await producer.shutdown()
    return out
