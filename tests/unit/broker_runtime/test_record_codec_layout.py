"""CommitLog message units: byte-exact RocketMQ 4.x layout and round trips, checked against the
independent reference encoder in record_codec_helpers.py."""

from __future__ import annotations

import struct
import tempfile
import zlib
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker_runtime.common.clock import FakeClock
from broker_runtime.common.message import Message
from broker_runtime.store import record_codec as codec
from broker_runtime.store.message_store import MessageStore
from tests.unit.broker_runtime.record_codec_helpers import (
    I32,
    I64,
    assert_decoded_equals,
    encode_at,
    full_message,
    host_config,
    ref_encode,
)

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
    buf = bytes(37) + raw + b"\xff" * 50  # bytes after it are not its properties
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
    cfg = host_config(tmp_path / "s")
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
    cfg = host_config(tmp_path / "s")
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
        cfg = host_config(Path(d) / "s")
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
