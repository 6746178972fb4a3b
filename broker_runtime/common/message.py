"""Messages as a producer hands them over and as the store keeps them, and their ids."""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, field

# Property names, as RocketMQ's MessageConst spells them.
KEYS = "KEYS"
TAGS = "TAGS"
UNIQ_KEY = "UNIQ_KEY"
DELAY = "DELAY"
RETRY_TOPIC = "RETRY_TOPIC"
REAL_TOPIC = "REAL_TOPIC"
REAL_QUEUE_ID = "REAL_QID"
ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
# Set by mqaudit's DLQ replay on each message it sends back (the audit reads them).
REPLAY_ID_PROPERTY = "MQAUDIT_REPLAY_ID"
REPLAY_OF_PROPERTY = "MQAUDIT_REPLAY_OF"  # offset msg id of the dead-letter copy replayed
RECONSUME_TIME = "RECONSUME_TIME"
MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
CLUSTER = "CLUSTER"  # the broker's cluster, stamped on every stored message
WAIT = "WAIT"  # WAIT_STORE_MSG_OK: the producer waits for the store (never stored alone)
TRAN_MSG = "TRAN_MSG"  # a transaction's half message (PROPERTY_TRANSACTION_PREPARED)
PRODUCER_GROUP = "PGROUP"
TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
KEY_SEPARATOR = " "

# MessageSysFlag's transaction bits (2-3): a unit's place in a transaction.
TRANSACTION_MASK = 0xC
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC


def with_transaction_type(sys_flag: int, kind: int) -> int:
    """MessageSysFlag.resetTransactionValue."""
    return (sys_flag & ~TRANSACTION_MASK) | kind


NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

HostPort = tuple[str, int]


def encode_host(host: HostPort) -> bytes:
    """8 bytes as RocketMQ stores an IPv4 socket address: 4 address bytes, i32 port."""
    return socket.inet_aton(host[0]) + struct.pack(">i", host[1])


def decode_host(raw: bytes) -> HostPort:
    return socket.inet_ntoa(raw[:4]), struct.unpack(">i", raw[4:8])[0]


def offset_msg_id(store_host: HostPort, phys_offset: int) -> str:
    """The broker-side message id: store host and commitlog offset, 32 upper-case hex digits."""
    return (encode_host(store_host) + struct.pack(">q", phys_offset)).hex().upper()


def decode_offset_msg_id(msg_id: str) -> tuple[HostPort, int]:
    """Inverse of `offset_msg_id`; raises ValueError on a malformed id."""
    raw = bytes.fromhex(msg_id)
    if len(raw) != 16:
        raise ValueError(f"an offset message id has 32 hex digits, got {len(msg_id)}")
    return decode_host(raw[:8]), struct.unpack(">q", raw[8:])[0]


def properties_to_string(props: dict[str, str]) -> str:
    """`k\\x01v\\x02` for each property, RocketMQ's `messageProperties2String`."""
    return "".join([f"{k}{NAME_VALUE_SEPARATOR}{v}{PROPERTY_SEPARATOR}" for k, v in props.items()])


def string_to_properties(text: str) -> dict[str, str]:
    """Inverse of `properties_to_string`; items without a separator are skipped as Java does."""
    out: dict[str, str] = {}
    for item in text.split(PROPERTY_SEPARATOR):
        name, sep, value = item.partition(NAME_VALUE_SEPARATOR)
        if sep:
            out[name] = value
    return out


class _Properties:
    """TAGS, KEYS and UNIQ_KEY read from a message's properties."""

    __slots__ = ()
    properties: dict[str, str]

    @property
    def tags(self) -> str | None:
        return self.properties.get(TAGS)

    @property
    def keys(self) -> str | None:
        return self.properties.get(KEYS)

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(UNIQ_KEY)


@dataclass(slots=True)
class Message(_Properties):
    """A message on its way into the store (what a send request carries)."""

    topic: str
    body: bytes
    properties: dict[str, str] = field(default_factory=dict)
    queue_id: int = 0
    flag: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: HostPort = ("127.0.0.1", 0)
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0


@dataclass(slots=True)
class StoredMessage(_Properties):
    """One message unit read back from the CommitLog, every header field included."""

    total_size: int
    magic: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    phys_offset: int
    sys_flag: int
    born_timestamp: int
    born_host: HostPort
    store_timestamp: int
    store_host: HostPort
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes
    topic: str
    properties: dict[str, str]

    @property
    def msg_id(self) -> str:
        """The offset message id (store host + physical offset)."""
        return offset_msg_id(self.store_host, self.phys_offset)
