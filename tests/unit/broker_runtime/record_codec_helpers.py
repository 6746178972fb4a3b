"""Helpers for the record codec tests (test_record_codec_*.py).

The reference encoder below is written from the RocketMQ 4.x layout alone (one `struct.pack`
per field, `ipaddress` for hosts) so that it shares no code with `record_codec`.
"""

from __future__ import annotations

import ipaddress
import struct
import zlib
from pathlib import Path

from broker_runtime.common.config import StoreConfig
from broker_runtime.common.message import Message, StoredMessage
from broker_runtime.store import record_codec as codec

STORE_HOST = ("10.1.2.3", 10911)
I32 = (-(2**31), 2**31 - 1)
I64 = (-(2**63), 2**63 - 1)


# -- the independent reference encoder ---------------------------------------------------------


def ref_host(host: tuple[str, int]) -> bytes:
    return ipaddress.IPv4Address(host[0]).packed + struct.pack(">i", host[1])


def ref_properties(props: dict[str, str]) -> bytes:
    return "".join(f"{k}\x01{v}\x02" for k, v in props.items()).encode("utf-8")


def ref_encode(
    msg: Message,
    *,
    queue_offset: int,
    phys_offset: int,
    store_timestamp: int,
    store_host: tuple[str, int] = STORE_HOST,
) -> bytes:
    """A RocketMQ 4.x message unit (IPv4 hosts), field by field."""
    topic = msg.topic.encode("utf-8")
    props = ref_properties(msg.properties)
    body = bytes(msg.body)
    fields = [
        struct.pack(">I", 0xDAA320A7),  # MAGICCODE
        struct.pack(">i", zlib.crc32(body) & 0x7FFFFFFF),  # BODYCRC, UtilAll.crc32
        struct.pack(">i", msg.queue_id),  # QUEUEID
        struct.pack(">i", msg.flag),  # FLAG
        struct.pack(">q", queue_offset),  # QUEUEOFFSET
        struct.pack(">q", phys_offset),  # PHYSICALOFFSET
        struct.pack(">i", msg.sys_flag),  # SYSFLAG
        struct.pack(">q", msg.born_timestamp),  # BORNTIMESTAMP
        ref_host(msg.born_host),  # BORNHOST
        struct.pack(">q", store_timestamp),  # STORETIMESTAMP
        ref_host(store_host),  # STOREHOSTADDRESS
        struct.pack(">i", msg.reconsume_times),  # RECONSUMETIMES
        struct.pack(">q", msg.prepared_transaction_offset),  # PREPAREDTRANSACTIONOFFSET
        struct.pack(">i", len(body)) + body,  # BODY
        struct.pack(">B", len(topic)) + topic,  # TOPIC
        struct.pack(">h", len(props)) + props,  # PROPERTIES
    ]
    rest = b"".join(fields)
    return struct.pack(">i", 4 + len(rest)) + rest  # TOTALSIZE counts itself


def full_message(**overrides: object) -> Message:
    """A message with every header field set to a distinctive non-default value."""
    fields: dict[str, object] = dict(
        topic="TopicTest",
        body=b"hello \x00\xff world",
        properties={"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "C0A80001", "WAIT": "true"},
        queue_id=3,
        flag=0x1234,
        sys_flag=0x8,
        born_timestamp=1_700_000_123_456,
        born_host=("192.168.7.9", 54321),
        reconsume_times=7,
        prepared_transaction_offset=987_654_321_012,
    )
    fields.update(overrides)
    return Message(**fields)  # type: ignore[arg-type]


def encode_at(msg: Message, qo: int, phys: int, store_ts: int) -> bytes:
    """What commit_log.put writes, through the codec's own encoder."""
    p = codec.prepare(msg)
    out = bytearray()
    store = ref_host(STORE_HOST)
    codec.encode_into(out, p, qo, phys, store_ts, store[:4], int.from_bytes(store[4:], "big"))
    return bytes(out)


def assert_decoded_equals(m: StoredMessage, msg: Message, qo: int, phys: int, ts: int) -> None:
    raw_body = bytes(msg.body)
    expected = StoredMessage(
        total_size=codec.record_size(
            len(raw_body),
            len(msg.topic.encode()),
            len(ref_properties(msg.properties)),
        ),
        magic=codec.MESSAGE_MAGIC,
        body_crc=zlib.crc32(raw_body) & 0x7FFFFFFF,
        queue_id=msg.queue_id,
        flag=msg.flag,
        queue_offset=qo,
        phys_offset=phys,
        sys_flag=msg.sys_flag,
        born_timestamp=msg.born_timestamp,
        born_host=msg.born_host,
        store_timestamp=ts,
        store_host=STORE_HOST,
        reconsume_times=msg.reconsume_times,
        prepared_transaction_offset=msg.prepared_transaction_offset,
        body=raw_body,
        topic=msg.topic,
        properties=dict(msg.properties),
    )
    assert m == expected


def host_config(store_dir: Path) -> StoreConfig:
    """A store with 64 KiB segments on STORE_HOST, the host `ref_encode` writes by default."""
    return StoreConfig(store_dir=store_dir, segment_size=64 * 1024, store_host=STORE_HOST)
