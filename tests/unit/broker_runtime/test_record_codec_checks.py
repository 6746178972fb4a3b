"""CommitLog message units: `check_unit` on valid, damaged and blank units, and the messages
`prepare` refuses to encode."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from broker_runtime.common.config import StoreConfig
from broker_runtime.common.message import Message
from broker_runtime.common.topics import InvalidNameError
from broker_runtime.store import record_codec as codec
from broker_runtime.store.message_store import MessageStore
from broker_runtime.store.record_codec import MessageRejected, RecordError
from tests.unit.broker_runtime.record_codec_helpers import encode_at, full_message
from tests.unit.pipeline.stores import unit as unit_bytes

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
    smallest = unit_bytes(b"", topic=b"", body=b"")  # no body, topic or properties: 91 bytes
    assert codec.check_unit(smallest, 0, len(smallest)) == codec.HEADER_SIZE + 3
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
    # The smallest possible unit, cut: torn too (not bad_size).
    smallest = struct.pack(">ii", codec.HEADER_SIZE + 3, codec.MESSAGE_MAGIC) + bytes(40)
    assert reason(smallest) == "torn"
    for total in (codec.HEADER_SIZE, codec.HEADER_SIZE + 2):  # below the smallest unit
        head = struct.pack(">ii", total, codec.MESSAGE_MAGIC)
        assert reason(head + bytes(40)) == "bad_size"  # cut short, and
        assert reason(head + bytes(total)) == "bad_size"  # with room for it


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
