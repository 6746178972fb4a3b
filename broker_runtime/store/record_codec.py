"""One CommitLog message unit <-> bytes, exactly as RocketMQ 4.x lays it out (IPv4 hosts).

TOTALSIZE i32 | MAGICCODE i32 | BODYCRC i32 | QUEUEID i32 | FLAG i32 | QUEUEOFFSET i64 |
PHYSICALOFFSET i64 | SYSFLAG i32 | BORNTIMESTAMP i64 | BORNHOST 4+i32 | STORETIMESTAMP i64 |
STOREHOSTADDRESS 4+i32 | RECONSUMETIMES i32 | PREPAREDTRANSACTIONOFFSET i64 |
BODY i32 len + bytes | TOPIC u8 len + bytes | PROPERTIES i16 len + bytes, big-endian.

A segment that cannot take the next message is closed by a blank unit: TOTALSIZE = the
bytes left in the file, MAGICCODE = 0xCBD43194. No I/O here: plain functions over buffers.
"""

from __future__ import annotations

import mmap
import struct
import zlib
from collections.abc import Sequence
from functools import partial
from itertools import islice
from operator import itemgetter
from typing import NamedTuple

from broker_runtime.common.java_hash import tags_code
from broker_runtime.common.message import (
    KEYS,
    NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    TAGS,
    UNIQ_KEY,
    Message,
    StoredMessage,
    decode_host,
    encode_host,
    properties_to_string,
    string_to_properties,
)
from broker_runtime.common.topics import validate_topic
from broker_runtime.store.accel import native

MESSAGE_MAGIC = -626843481  # 0xDAA320A7 as a signed i32
BLANK_MAGIC = -875286124  # 0xCBD43194
END_FILE_MIN_BLANK_LENGTH = 8  # TOTALSIZE + MAGICCODE of the blank unit
MAX_PROPERTIES_LENGTH = 32767  # an i16 length
MAX_TOPIC_LENGTH = 127
DEFAULT_MAX_MESSAGE_SIZE = 4 * 1024 * 1024

HEADER = struct.Struct(">iiiiiqqiq4siq4siiqi")  # every fixed field up to BODY's length
HEADER_SIZE = HEADER.size  # 88
STORE_TIMESTAMP_AT = 56  # STORETIMESTAMP's byte position in a unit
_PREFIX = struct.Struct(">ii")  # TOTALSIZE, MAGICCODE
_I16 = struct.Struct(">h")
_PORT = struct.Struct(">i")
_FIELDS = struct.Struct(">iiiqiq")  # the per-message header fields, range-checked in prepare
_SIZE = itemgetter(0)  # Prepared.size
_CRC_OFFSET = 8


Buffer = bytes | bytearray | memoryview | mmap.mmap


class RecordError(ValueError):
    """Bytes at a position are not a valid message unit; `reason` is machine readable."""

    def __init__(self, reason: str, position: int, detail: str) -> None:
        super().__init__(f"{reason} at {position}: {detail}")
        self.reason = reason
        self.position = position


class MessageRejected(ValueError):
    """A message the store refuses to write (bad topic, too large, bad properties)."""


def _body_crc(body: Buffer) -> int:
    """BODYCRC as RocketMQ's `UtilAll.crc32` stores it: CRC32 with the sign bit cleared."""
    return zlib.crc32(body) & 0x7FFFFFFF


body_crc = _body_crc if native is None else native.body_crc


def record_size(body_len: int, topic_len: int, props_len: int) -> int:
    return HEADER_SIZE + body_len + 1 + topic_len + 2 + props_len


class Prepared(NamedTuple):
    """Everything of a message that does not depend on where it lands in the log."""

    size: int
    body_crc: int
    queue_id: int
    flag: int
    sys_flag: int
    born_timestamp: int
    born_ip: bytes
    born_port: int
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes
    tail: bytes  # TOPIC and PROPERTIES, length-prefixed
    topic: str
    tags_code: int
    uniq_key: str | None
    keys: str | None


_new_prepared = tuple.__new__  # skips NamedTuple's Python-level __new__ on the hot path
_valid_topics: set[str] = set()  # names already checked: the check is per message otherwise
_hosts: dict[tuple[str, int], bytes] = {}


def _checked_topic(topic: str) -> str:
    if topic not in _valid_topics:
        validate_topic(topic)
        if len(_valid_topics) < 100_000:
            _valid_topics.add(topic)
    return topic


def _host_bytes(host: tuple[str, int]) -> bytes:
    raw = _hosts.get(host)
    if raw is None:
        raw = encode_host(host)
        if len(_hosts) < 10_000:
            _hosts[host] = raw
    return raw


def prepare(msg: Message, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> Prepared:
    """Validate a message and encode the parts that do not depend on its log position.

    Raises MessageRejected (or InvalidNameError for the topic) saying what is wrong.
    """
    topic = _checked_topic(msg.topic)
    body = msg.body
    if type(body) is not bytes:
        if not isinstance(body, bytearray | memoryview):
            raise MessageRejected(f"message body must be bytes, got {type(body).__name__}")
        body = bytes(body)
    if len(body) > max_message_size:
        raise MessageRejected(
            f"message body is {len(body)} bytes, maxMessageSize is {max_message_size}"
        )
    props = msg.properties
    text = properties_to_string(props)
    n = len(props)
    if text.count(NAME_VALUE_SEPARATOR) != n or text.count(PROPERTY_SEPARATOR) != n:
        raise MessageRejected("a property name or value contains a \\x01 or \\x02 separator")
    try:
        born = _host_bytes(msg.born_host)
        raw_props = text.encode()
        _FIELDS.pack(
            msg.queue_id, msg.flag, msg.sys_flag, msg.born_timestamp,
            msg.reconsume_times, msg.prepared_transaction_offset,
        )  # fmt: skip
    except (UnicodeEncodeError, struct.error, OSError, TypeError, ValueError) as e:
        # Refused here: a failure inside CommitLog.put would leave a queue-offset gap.
        raise MessageRejected(f"message cannot be encoded: {e}") from e
    if len(raw_props) > MAX_PROPERTIES_LENGTH:
        raise MessageRejected(
            f"properties are {len(raw_props)} bytes encoded, the limit is {MAX_PROPERTIES_LENGTH}"
        )
    if msg.queue_id < 0:
        raise MessageRejected(f"queue id {msg.queue_id} is negative")
    raw_topic = topic.encode()
    size = record_size(len(body), len(raw_topic), len(raw_props))
    if size > max_message_size:  # RocketMQ's CommitLog limits the whole unit, not the body
        raise MessageRejected(f"message unit is {size} bytes, maxMessageSize is {max_message_size}")
    return _new_prepared(
        Prepared,
        (
            size,
            zlib.crc32(body) & 0x7FFFFFFF,
            msg.queue_id,
            msg.flag,
            msg.sys_flag,
            msg.born_timestamp,
            born[:4],
            _PORT.unpack_from(born, 4)[0],
            msg.reconsume_times,
            msg.prepared_transaction_offset,
            body,
            b"%c%b%b%b" % (len(raw_topic), raw_topic, _I16.pack(len(raw_props)), raw_props),
            topic,
            tags_code(props.get(TAGS)),
            props.get(UNIQ_KEY),
            props.get(KEYS),
        ),
    )


def prepare_batch(
    msgs: Sequence[Message], max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
) -> Sequence[Prepared]:
    """`prepare` of each message, in order; the first bad one raises as `prepare` does.

    The C kernel takes the common case itself and hands any other message to `prepare`; its
    batch keeps no tuple per message, and builds the Prepared tuples only when indexed.
    """
    if native is not None:
        return native.prepare_batch(  # type: ignore[no-any-return]
            msgs, max_message_size, _valid_topics, _hosts, prepare, Prepared
        )
    return [prepare(m, max_message_size) for m in msgs]


def largest_unit(batch: Sequence[Prepared]) -> int:
    """Size of the biggest unit of a `prepare_batch` result (0 when empty)."""
    if native is not None and isinstance(batch, native.PreparedBatch):
        return batch.largest  # type: ignore[no-any-return]
    return max(map(_SIZE, batch), default=0)


def encode_into(
    out: bytearray,
    p: Prepared,
    queue_offset: int,
    phys_offset: int,
    store_timestamp: int,
    store_ip: bytes,
    store_port: int,
) -> None:
    """Append the full message unit of `p` to `out`."""
    out += HEADER.pack(
        p[0], MESSAGE_MAGIC, p[1], p[2], p[3], queue_offset, phys_offset, p[4], p[5], p[6],
        p[7], store_timestamp, store_ip, store_port, p[8], p[9], len(p[10]),
    )  # fmt: skip
    out += p[10]
    out += p[11]


def _encode_run(
    batch: Sequence[Prepared],
    start: int,
    room: int,
    base: int,
    now: int,
    store_ip: bytes,
    store_port: int,
    qtable: dict[tuple[str, int], int],
    taken: dict[tuple[str, int], int],
    results: list[DispatchRequest],
    buf: bytearray,
) -> int:
    """Encode batch[start:] into `buf` while the units fit in `room` bytes; returns the stop.

    `buf` holds the segment's bytes from log offset `base` on. Queue offsets come from `taken`
    (this put's), else `qtable` (the log's), and go back into `taken`; each message's
    DispatchRequest is appended to `results`.
    """
    new = tuple.__new__  # NamedTuple's own __new__ is Python code: too slow per message
    for i, p in enumerate(islice(batch, start, None), start):
        if p.size > room - len(buf):
            return i
        phys = base + len(buf)
        topic, qid = key = (p.topic, p.queue_id)
        qo = taken.get(key)
        if qo is None:
            qo = qtable.get(key, 0)
        taken[key] = qo + 1
        encode_into(buf, p, qo, phys, now, store_ip, store_port)
        req = (topic, qid, qo, phys, p.size, now, p.tags_code, p.uniq_key, p.keys)
        results.append(new(DispatchRequest, req))
    return max(start, len(batch))


def crc_ok(buf: Buffer, pos: int) -> bool:
    """Whether the BODYCRC of the structurally checked unit at `pos` matches its body."""
    view = memoryview(buf)
    crc = int.from_bytes(view[pos + _CRC_OFFSET : pos + _CRC_OFFSET + 4], "big", signed=True)
    b = pos + HEADER_SIZE
    body_len = int.from_bytes(view[b - 4 : b], "big", signed=True)
    return body_crc(view[b : b + body_len]) == crc


def blank_record(length: int) -> bytes:
    """The end-of-file unit filling the last `length` bytes of a segment."""
    return _PREFIX.pack(length, BLANK_MAGIC) + bytes(length - END_FILE_MIN_BLANK_LENGTH)


def check_unit(buf: Buffer, pos: int, limit: int, *, check_crc: bool = True) -> int:
    """Validate the unit at `pos` and return its size; a blank unit returns -size.

    Raises RecordError with reason `eof` (no bytes or all zero: nothing was written here),
    `torn` (the unit runs past `limit`), `bad_magic`, `bad_size`, `bad_crc` or `bad_lengths`.
    """
    view = memoryview(buf)
    if limit - pos < END_FILE_MIN_BLANK_LENGTH:
        raise RecordError("eof", pos, "no room for a unit")
    total: int
    magic: int
    total, magic = _PREFIX.unpack_from(view, pos)
    if magic == BLANK_MAGIC:
        if total != limit - pos:
            raise RecordError("bad_size", pos, f"blank unit of {total} bytes, {limit - pos} left")
        return -total
    if magic != MESSAGE_MAGIC:
        if total == 0 and magic == 0:
            raise RecordError("eof", pos, "zero bytes")
        raise RecordError("bad_magic", pos, f"magic {magic & 0xFFFFFFFF:#010x}")
    if total < HEADER_SIZE + 3 or total > limit - pos:
        reason = "torn" if total > limit - pos and total >= HEADER_SIZE + 3 else "bad_size"
        raise RecordError(reason, pos, f"TOTALSIZE {total}, {limit - pos} bytes left")
    body_len = int.from_bytes(view[pos + HEADER_SIZE - 4 : pos + HEADER_SIZE], "big", signed=True)
    t = pos + HEADER_SIZE + body_len
    if body_len < 0 or t + 3 > pos + total:
        raise RecordError("bad_lengths", pos, f"body length {body_len} in a {total}-byte unit")
    topic_len = view[t]
    props_len = int.from_bytes(view[t + 1 + topic_len : t + 3 + topic_len], "big", signed=True)
    if record_size(body_len, topic_len, props_len) != total:
        raise RecordError("bad_lengths", pos, f"field lengths do not add up to {total}")
    if check_crc and not crc_ok(view, pos):
        raise RecordError("bad_crc", pos, "BODYCRC does not match the body")
    return total


def decode(buf: Buffer, pos: int = 0, errors: str = "strict") -> StoredMessage:
    """Decode the (already checked) message unit at `pos`; `errors` as bytes.decode's for
    its topic and properties (UnicodeDecodeError by default)."""
    view = memoryview(buf)
    (
        total,
        magic,
        crc,
        queue_id,
        flag,
        queue_offset,
        phys_offset,
        sys_flag,
        born_ts,
        born_ip,
        born_port,
        store_ts,
        store_ip,
        store_port,
        reconsume_times,
        prepared_tx,
        body_len,
    ) = HEADER.unpack_from(view, pos)
    p = pos + HEADER_SIZE
    body = bytes(view[p : p + body_len])
    p += body_len
    topic_len = view[p]
    topic = bytes(view[p + 1 : p + 1 + topic_len]).decode(errors=errors)
    p += 1 + topic_len
    props_len = _I16.unpack_from(view, p)[0]
    props = bytes(view[p + 2 : p + 2 + props_len]).decode(errors=errors)
    return StoredMessage(
        total_size=total,
        magic=magic,
        body_crc=crc,
        queue_id=queue_id,
        flag=flag,
        queue_offset=queue_offset,
        phys_offset=phys_offset,
        sys_flag=sys_flag,
        born_timestamp=born_ts,
        born_host=decode_host(born_ip + born_port.to_bytes(4, "big", signed=True)),
        store_timestamp=store_ts,
        store_host=decode_host(store_ip + store_port.to_bytes(4, "big", signed=True)),
        reconsume_times=reconsume_times,
        prepared_transaction_offset=prepared_tx,
        body=body,
        topic=topic,
        properties=string_to_properties(props),
    )


class DispatchRequest(NamedTuple):
    """What the ConsumeQueue and the index need of one stored message."""

    topic: str
    queue_id: int
    queue_offset: int
    phys_offset: int
    size: int
    store_timestamp: int
    tags_code: int
    uniq_key: str | None
    keys: str | None


def dispatch_request(buf: Buffer, pos: int, phys_offset: int) -> DispatchRequest:
    """The dispatch request of the checked unit at `pos` (found at log offset `phys_offset`)."""
    m = decode(buf, pos)
    return DispatchRequest(
        m.topic,
        m.queue_id,
        m.queue_offset,
        phys_offset,
        m.total_size,
        m.store_timestamp,
        tags_code(m.properties.get(TAGS)),
        m.properties.get(UNIQ_KEY),
        m.properties.get(KEYS),
    )


# The C kernel builds DispatchRequests itself: it is handed the class once, here.
encode_run = _encode_run if native is None else partial(native.encode_run, DispatchRequest)
