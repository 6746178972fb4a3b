"""The shapes of the client API: messages in and out, send and pull results, and the enums
RocketMQ's client names (SendStatus, PullStatus, ConsumeConcurrentlyStatus, ...)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from broker_runtime.client.rebalance import MessageQueue
from broker_runtime.common.message import (
    DELAY,
    KEY_SEPARATOR,
    KEYS,
    TAGS,
    UNIQ_KEY,
    HostPort,
    Message,
    StoredMessage,
)


class MQClientError(Exception):
    """The client could not do what was asked (no route, no broker, all retries failed)."""


class MQBrokerError(MQClientError):
    """A broker answered with an error code."""

    def __init__(self, code: int, remark: str | None, addr: str) -> None:
        super().__init__(f"broker {addr} answered code {code}: {remark or ''}".rstrip(": "))
        self.code = code
        self.remark = remark
        self.addr = addr


def new_message(
    topic: str,
    body: bytes,
    *,
    tags: str | None = None,
    keys: str | list[str] | None = None,
    delay_level: int | None = None,
    properties: dict[str, str] | None = None,
) -> Message:
    """A message to send; `keys` are indexed by the broker for query by key."""
    props = dict(properties or {})
    if tags:
        props[TAGS] = tags
    if keys:
        props[KEYS] = keys if isinstance(keys, str) else KEY_SEPARATOR.join(keys)
    if delay_level:
        props[DELAY] = str(delay_level)
    return Message(topic=topic, body=body, properties=props)


class SendStatus(StrEnum):
    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"  # stored, not yet on disk
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"  # stored on the master, slave did not confirm
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"  # stored on the master, no slave


@dataclass(frozen=True, slots=True)
class SendResult:
    """`msg_id` is the UNIQ_KEY; a batch's messages are at `queue_offset + i`."""

    status: SendStatus
    msg_id: str
    offset_msg_id: str
    mq: MessageQueue
    queue_offset: int
    msg_ids: tuple[str, ...] = ()  # every UNIQ_KEY of a batch, in order


class PullStatus(StrEnum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


@dataclass(slots=True)
class ReceivedMessage:
    """A stored message as a consumer gets it, with the broker it came from."""

    msg: StoredMessage
    broker: str

    @property
    def mq(self) -> MessageQueue:
        return MessageQueue(self.msg.topic, self.broker, self.msg.queue_id)

    @property
    def msg_id(self) -> str:
        """The producer's UNIQ_KEY; the offset id for a message sent without one."""
        return self.msg.properties.get(UNIQ_KEY) or self.msg.msg_id

    @property
    def uniq_key(self) -> str | None:
        return self.msg.properties.get(UNIQ_KEY)

    @property
    def offset_msg_id(self) -> str:
        return self.msg.msg_id

    @property
    def topic(self) -> str:
        return self.msg.topic

    @property
    def queue_id(self) -> int:
        return self.msg.queue_id

    @property
    def queue_offset(self) -> int:
        return self.msg.queue_offset

    @property
    def body(self) -> bytes:
        return self.msg.body

    @property
    def tags(self) -> str | None:
        return self.msg.properties.get(TAGS)

    @property
    def keys(self) -> str | None:
        return self.msg.properties.get(KEYS)

    @property
    def properties(self) -> dict[str, str]:
        return self.msg.properties

    @property
    def reconsume_times(self) -> int:
        return self.msg.reconsume_times

    @property
    def born_timestamp(self) -> int:
        return self.msg.born_timestamp

    @property
    def store_timestamp(self) -> int:
        return self.msg.store_timestamp

    @property
    def store_host(self) -> HostPort:
        return self.msg.store_host


@dataclass(slots=True)
class PullResult:
    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[ReceivedMessage]
    suggest_which_broker_id: int = 0


class ConsumeStatus(StrEnum):
    """What a listener returns (ConsumeConcurrentlyStatus); an exception or None counts as
    RECONSUME_LATER."""

    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class MessageModel(StrEnum):
    CLUSTERING = "CLUSTERING"  # the group shares the queues; offsets on the brokers
    BROADCASTING = "BROADCASTING"  # every consumer gets every message; offsets in a local file


class ConsumeFromWhere(StrEnum):
    """Where a group with no committed offset starts."""

    LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"
    FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"
    TIMESTAMP = "CONSUME_FROM_TIMESTAMP"
