"""CommitLog message units: byte-exact RocketMQ 4.x layout, round trips and `check_unit`.

The reference encoder below is written from the RocketMQ 4.x layout alone (one `struct.pack`
per field, `ipaddress` for hosts) so that it shares no code with `record_codec`.
"""

from __future__ import annotations

import ipaddress
import struct
import tempfile
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker_runtime.common.clock import FakeClock
from broker_runtime.common.config import StoreConfig
from broker_runtime.common.message import Message, StoredMessage
from broker_runtime.common.topics import InvalidNameError
from broker_runtime.store import record_codec as codec
from broker_runtime.store.message_store import MessageStore
from broker_runtime.store.record_codec import MessageRejected, RecordError

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


# -- layout -------------------------------------------------------------------------------------


def test_constants_are_rocketmq_4() -> None:
    assert codec.MESSAGE_MAGIC & 0xFFFFFFFF == 0xDAA320A7
    assert codec.BLANK_MAGIC & 0xFFFFFFFF == 0xCBD43194
    assert codec.HEADER_SIZE == 88  # every fixed field, BODY's length included
    assert codec.END_FILE_MIN_BLANK_LENGTH == 8
    assert codec.record_size(10, 5, 7) == 88 + 10 + 1 + 5 + 2 + 7


def test_encode_matches_reference_bytes_and_offsets_of_every_field() -> None:
    msg = full_message()
    raw = encode_at(msg, qo=42, phys=1 << 33, store_ts=1_700_000_999_000)
    assert raw == ref_encode(
        msg, queue_offset=42, phys_offset=1 << 33, store_timestamp=1_700_000_999_000
    )
    # Spot-check absolute positions as RocketMQ's MessageDecoder reads them.
    assert struct.unpack_from(">i", raw, 0)[0] == len(raw)
    assert raw[4:8] == bytes.fromhex("DAA320A7")
    assert struct.unpack_from(">i", raw, 12)[0] == 3  # QUEUEID
    assert struct.unpack_from(">i", raw, 16)[0] == 0x1234  # FLAG
    assert struct.unpack_from(">q", raw, 20)[0] == 42  # QUEUEOFFSET
    assert struct.unpack_from(">q", raw, 28)[0] == 1 << 33  # PHYSICALOFFSET
    assert struct.unpack_from(">i", raw, 36)[0] == 0x8  # SYSFLAG
    assert struct.unpack_from(">q", raw, 40)[0] == 1_700_000_123_456  # BORNTIMESTAMP
    assert raw[48:56] == bytes([192, 168, 7, 9]) + struct.pack(">i", 54321)  # BORNHOST
    assert struct.unpack_from(">q", raw, 56)[0] == 1_700_000_999_000  # STORETIMESTAMP
    assert raw[64:72] == bytes([10, 1, 2, 3]) + struct.pack(">i", 10911)  # STOREHOST
    assert struct.unpack_from(">i", raw, 72)[0] == 7  # RECONSUMETIMES
    assert struct.unpack_from(">q", raw, 76)[0] == 987_654_321_012  # PREPAREDTXOFFSET
    assert struct.unpack_from(">i", raw, 84)[0] == len(msg.body)  # BODY length
    assert raw[88 : 88 + len(msg.body)] == msg.body
    t = 88 + len(msg.body)
    assert raw[t] == len("TopicTest")
    assert raw[t + 1 : t + 10] == b"TopicTest"
    plen = struct.unpack_from(">h", raw, t + 10)[0]
    assert (
        raw[t + 12 :]
        == b"TAGS\x01TagA\x02KEYS\x01k1 k2\x02UNIQ_KEY\x01C0A80001\x02WAIT\x01true\x02"
    )
    assert plen == len(raw) - t - 12


def test_body_crc_is_utilall_crc32_with_sign_bit_cleared() -> None:
    body = b"The quick brown fox jumps over the lazy dog"
    assert zlib.crc32(body) == 0x414FA339
    assert codec.body_crc(body) == 0x414FA339
    # A body whose CRC has the top bit set: Java stores it with the sign bit cleared.
    top = next(bytes([i]) for i in range(256) if zlib.crc32(bytes([i])) & 0x80000000)
    assert codec.body_crc(top) == zlib.crc32(top) - 0x80000000
    raw = encode_at(Message("T", top), 0, 0, 0)
    assert struct.unpack_from(">i", raw, 8)[0] == zlib.crc32(top) & 0x7FFFFFFF >= 0


def test_decode_round_trips_every_field() -> None:
    msg = full_message()
    raw = encode_at(msg, qo=9, phys=123_456, store_ts=1_700_000_000_001)
    assert codec.check_unit(raw, 0, len(raw)) == len(raw)
    assert_decoded_equals(codec.decode(raw), msg, 9, 123_456, 1_700_000_000_001)
    # At a position inside a bigger buffer, as the log holds it.
    buf = bytes(37) + raw + bytes(50)
    assert codec.check_unit(buf, 37, len(buf)) == len(raw)
    assert_decoded_equals(codec.decode(buf, 37), msg, 9, 123_456, 1_700_000_000_001)


def test_extreme_field_values_round_trip() -> None:
    msg = full_message(
        queue_id=2**31 - 1,
        flag=I32[0],
        sys_flag=I32[1],
        born_timestamp=I64[0],
        born_host=("255.255.255.255", 65535),
        reconsume_times=I32[1],
        prepared_transaction_offset=I64[1],
        body=b"",
        topic="t" * 127,
        properties={},
    )
    raw = encode_at(msg, qo=I64[1], phys=I64[1], store_ts=I64[0])
    assert raw == ref_encode(msg, queue_offset=I64[1], phys_offset=I64[1], store_timestamp=I64[0])
    assert_decoded_equals(codec.decode(raw), msg, I64[1], I64[1], I64[0])


def test_put_writes_reference_bytes_into_the_commitlog_file(tmp_path: Path) -> None:
    clock = FakeClock(start_ms=1_700_000_000_000)
    cfg = StoreConfig(store_dir=tmp_path / "s", segment_size=64 * 1024, store_host=STORE_HOST)
    msgs = [
        full_message(),
        full_message(queue_id=3, body=b"second", properties={"TAGS": "\u6807\u7b7e"}),
        full_message(topic="%RETRY%group-1", queue_id=0, body=bytes(range(256)) * 3),
        Message("T", b""),  # every default
    ]
    with MessageStore(cfg, clock=clock) as store:
        results = store.put_messages(msgs[:2])
        clock.advance(1500)
        results += [store.put_message(m) for m in msgs[2:]]
        store.wait_dispatched()
        log_end = store.commit_log.max_offset
    data = (tmp_path / "s" / "commitlog" / "00000000000000000000").read_bytes()
    expected = b""
    queue_offsets = {("TopicTest", 3): 0}
    for i, (m, r) in enumerate(zip(msgs, results, strict=True)):
        qo = queue_offsets.get((m.topic, m.queue_id), 0)
        queue_offsets[(m.topic, m.queue_id)] = qo + 1
        ts = 1_700_000_000_000 + (1500 if i >= 2 else 0)
        unit = ref_encode(m, queue_offset=qo, phys_offset=len(expected), store_timestamp=ts)
        assert (r.phys_offset, r.size, r.queue_offset) == (len(expected), len(unit), qo)
        assert r.store_timestamp == ts
        expected += unit
    assert log_end == len(expected)
    assert data[: len(expected)] == expected
    assert data[len(expected) :] == bytes(len(data) - len(expected))  # nothing else written


def test_store_reads_back_every_field(tmp_path: Path) -> None:
    clock = FakeClock(start_ms=1_700_000_000_000)
    cfg = StoreConfig(store_dir=tmp_path / "s", segment_size=64 * 1024, store_host=STORE_HOST)
    msg = full_message()
    with MessageStore(cfg, clock=clock) as store:
        r = store.put_message(msg)
        store.wait_dispatched()
        got = store.get_messages("TopicTest", 3, 0, 10).messages
        assert len(got) == 1
        assert_decoded_equals(got[0], msg, 0, r.phys_offset, 1_700_000_000_000)
        by_id = store.message_by_id(got[0].msg_id)
        assert by_id == got[0]


# -- property tests -----------------------------------------------------------------------------

TOPIC_CHARS = "%|abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"
prop_text = st.text(
    alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=["Cs"]),
    max_size=24,
)
messages = st.builds(
    Message,
    topic=st.text(alphabet=TOPIC_CHARS, min_size=1, max_size=127),
    body=st.binary(max_size=3000),
    properties=st.dictionaries(prop_text, prop_text, max_size=6),
    queue_id=st.integers(0, 7),
    flag=st.integers(*I32),
    sys_flag=st.integers(*I32),
    born_timestamp=st.integers(*I64),
    born_host=st.tuples(st.ip_addresses(v=4).map(str), st.integers(0, 65535)),
    reconsume_times=st.integers(*I32),
    prepared_transaction_offset=st.integers(*I64),
)


@settings(max_examples=300, deadline=None)
@given(
    msg=messages,
    qo=st.integers(0, I64[1]),
    phys=st.integers(0, I64[1]),
    ts=st.integers(*I64),
)
def test_property_encode_is_reference_and_decode_inverts_it(
    msg: Message, qo: int, phys: int, ts: int
) -> None:
    raw = encode_at(msg, qo, phys, ts)
    assert raw == ref_encode(msg, queue_offset=qo, phys_offset=phys, store_timestamp=ts)
    assert codec.prepare(msg).size == len(raw)
    assert codec.check_unit(raw, 0, len(raw)) == len(raw)
    assert_decoded_equals(codec.decode(raw), msg, qo, phys, ts)


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(batch=st.lists(messages, min_size=1, max_size=12))
def test_property_store_writes_reference_bytes(batch: list[Message]) -> None:
    clock = FakeClock(start_ms=1_700_000_000_000)
    with tempfile.TemporaryDirectory() as d:
        cfg = StoreConfig(store_dir=Path(d) / "s", segment_size=64 * 1024, store_host=STORE_HOST)
        with MessageStore(cfg, clock=clock) as store:
            results = store.put_messages(batch)
            store.wait_dispatched()
            qos: dict[tuple[str, int], int] = {}
            for m, r in zip(batch, results, strict=True):
                qo = qos.get((m.topic, m.queue_id), 0)
                qos[(m.topic, m.queue_id)] = qo + 1
                want = ref_encode(
                    m, queue_offset=qo, phys_offset=r.phys_offset, store_timestamp=clock.now_ms()
                )
                assert store.commit_log.read(r.phys_offset, r.size) == want
                got = store.get_messages(m.topic, m.queue_id, qo, 1).messages
                assert len(got) == 1
                assert_decoded_equals(got[0], m, qo, r.phys_offset, clock.now_ms())


# -- check_unit ---------------------------------------------------------------------------------


def valid_unit() -> bytearray:
    return bytearray(encode_at(full_message(body=b"0123456789abcdef"), 5, 1000, 1_700_000_000_000))


def reason(buf: bytes | bytearray, pos: int = 0, limit: int | None = None, **kw: bool) -> str:
    with pytest.raises(RecordError) as e:
        codec.check_unit(buf, pos, len(buf) if limit is None else limit, **kw)
    assert e.value.position == pos
    return e.value.reason


def test_check_unit_valid_returns_size() -> None:
    unit = valid_unit()
    assert codec.check_unit(unit, 0, len(unit)) == len(unit)
    assert codec.check_unit(bytes(unit) + bytes(100), 0, len(unit) + 100) == len(unit)


def test_check_unit_bad_magic() -> None:
    unit = valid_unit()
    unit[4:8] = bytes.fromhex("12345678")
    assert reason(unit) == "bad_magic"
    unit[4:8] = bytes(4)  # zero magic with a non-zero size is damage, not end of data
    assert reason(unit) == "bad_magic"


def test_check_unit_torn_when_totalsize_runs_past_the_limit() -> None:
    unit = valid_unit()
    assert reason(unit, limit=len(unit) - 1) == "torn"
    assert reason(bytes(unit[:100])) == "torn"  # a write cut short at the end of the data
    at = bytes(20) + bytes(unit[:-3])
    assert reason(at, pos=20) == "torn"


def test_check_unit_bad_crc_when_a_body_byte_flips() -> None:
    unit = valid_unit()
    unit[codec.HEADER_SIZE + 3] ^= 0x01
    assert reason(unit) == "bad_crc"
    assert codec.check_unit(unit, 0, len(unit), check_crc=False) == len(unit)
    unit = valid_unit()
    unit[8] ^= 0x40  # or the stored CRC itself
    assert reason(unit) == "bad_crc"


@pytest.mark.parametrize(
    "where, value",
    [
        (84, struct.pack(">i", 17)),  # BODY length one too long
        (84, struct.pack(">i", 15)),  # one too short
        (84, struct.pack(">i", -1)),  # negative
        (84, struct.pack(">i", 10_000)),  # past the unit
        (88 + 16, bytes([10])),  # TOPIC length
        (88 + 16 + 1 + 9, struct.pack(">h", 3)),  # PROPERTIES length
        (88 + 16 + 1 + 9, struct.pack(">h", -5)),
    ],
)
def test_check_unit_bad_lengths(where: int, value: bytes) -> None:
    unit = valid_unit()
    unit[where : where + len(value)] = value
    assert reason(unit) == "bad_lengths"


@pytest.mark.parametrize("total", [0, 1, 8, 90])
def test_check_unit_bad_size_below_the_minimum_unit(total: int) -> None:
    unit = valid_unit()
    unit[0:4] = struct.pack(">i", total)
    assert reason(unit) == "bad_size"


def test_check_unit_eof_for_zeros_and_for_no_room() -> None:
    assert reason(bytes(200)) == "eof"
    assert reason(bytes(200), pos=64) == "eof"
    assert reason(bytes(7)) == "eof"
    unit = bytes(valid_unit())
    assert reason(unit + bytes(5), pos=len(unit)) == "eof"  # fewer than 8 bytes left
    assert reason(unit + bytes(64), pos=len(unit)) == "eof"
    assert reason(b"", 0) == "eof"


@pytest.mark.parametrize("length", [8, 9, 88, 1000, 65536])
def test_blank_record_layout(length: int) -> None:
    blank = codec.blank_record(length)
    assert len(blank) == length
    assert struct.unpack_from(">i", blank, 0)[0] == length  # TOTALSIZE = the bytes left
    assert blank[4:8] == bytes.fromhex("CBD43194")
    assert blank[8:] == bytes(length - 8)
    assert codec.check_unit(blank, 0, length) == -length
    buf = bytes(valid_unit()) + blank
    assert codec.check_unit(buf, len(buf) - length, len(buf)) == -length


def test_blank_record_must_fill_to_the_limit() -> None:
    blank = codec.blank_record(100)
    assert reason(blank + bytes(4)) == "bad_size"
    assert reason(blank, limit=96) == "bad_size"


# -- rejected messages --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "props",
    [
        {"a\x01b": "v"},
        {"a": "v\x01w"},
        {"a\x02": "v"},
        {"a": "v\x02"},
        {"ok": "fine", "k": "\x01\x02"},
    ],
)
def test_properties_with_separators_are_rejected(props: dict[str, str], tmp_path: Path) -> None:
    with pytest.raises(MessageRejected):
        codec.prepare(Message("T", b"x", props))
    cfg = StoreConfig(store_dir=tmp_path / "s", segment_size=64 * 1024)
    with MessageStore(cfg) as store:
        store.put_message(Message("T", b"first"))
        end = store.commit_log.max_offset
        with pytest.raises(MessageRejected):
            store.put_messages([Message("T", b"ok"), Message("T", b"x", props)])
        assert store.commit_log.max_offset == end
        assert store.put_message(Message("T", b"next")).queue_offset == 1


def test_properties_length_limit_is_an_i16() -> None:
    # "k\x01" + value + "\x02" encodes to exactly 32767 bytes: accepted; one more: rejected.
    ok = codec.prepare(Message("T", b"", {"k": "v" * (32767 - 3)}))
    assert ok.size == codec.record_size(0, 1, 32767)
    with pytest.raises(MessageRejected):
        codec.prepare(Message("T", b"", {"k": "v" * (32767 - 2)}))
    with pytest.raises(MessageRejected):  # the limit is in encoded bytes, not characters
        codec.prepare(Message("T", b"", {"k": "\u00e9" * 16383}))


def test_other_rejections() -> None:
    with pytest.raises(MessageRejected):
        codec.prepare(Message("T", "text body"))  # type: ignore[arg-type]
    with pytest.raises(MessageRejected):
        codec.prepare(Message("T", b"x", queue_id=-1))
    with pytest.raises(MessageRejected):
        codec.prepare(Message("T", b"x", queue_id=2**31))
    with pytest.raises(MessageRejected):  # the limit covers the whole unit: 92 + body here
        codec.prepare(Message("T", b"x" * 9), max_message_size=100)
    assert codec.prepare(Message("T", b"x" * 8), max_message_size=100).size == 100
    assert codec.prepare(Message("T", bytearray(b"ab"))).body == b"ab"  # type: ignore[arg-type]
    with pytest.raises(InvalidNameError):
        codec.prepare(Message("a/b", b"x"))


# Found at 4a62814: these ints passed prepare() and HEADER.pack raised struct.error inside
# CommitLog.put, after queue offsets were taken (a gap) and possibly after a rolled segment had
# been written; a lone surrogate raised UnicodeEncodeError. prepare() now refuses them all.
@pytest.mark.parametrize(
    "field, value",
    [
        ("flag", 2**31),
        ("sys_flag", -(2**31) - 1),
        ("reconsume_times", 2**31),
        ("born_timestamp", 2**63),
        ("prepared_transaction_offset", -(2**63) - 1),
        ("queue_id", 2**31),
        ("born_host", ("1.2.3.4", 2**31)),
        ("born_host", ("999.1.1.1", 1)),
        ("properties", {"k": "\ud800"}),
    ],
)
def test_prepare_rejects_unencodable_fields(field: str, value: object) -> None:
    msg = full_message()
    setattr(msg, field, value)
    with pytest.raises(MessageRejected):
        codec.prepare(msg)
