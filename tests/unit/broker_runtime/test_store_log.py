"""MessageStore end to end on real files: put/get, segment rolls and blanks, ConsumeQueue bytes,
the store directory's layout."""

from __future__ import annotations

import os
import struct

import pytest

from broker_runtime.common.config import StoreConfig
from broker_runtime.common.message import Message
from broker_runtime.store import inspection
from broker_runtime.store import record_codec as codec
from broker_runtime.store.message_store import MessageStore
from broker_runtime.store.record_codec import MessageRejected
from tests.unit.broker_runtime.store_helpers import (
    BLANK_MAGIC,
    MESSAGE_MAGIC,
    SEG,
    all_messages,
    body_of,
    java_hash,
    log_files,
)


def test_java_hash_reference() -> None:
    assert java_hash("hello") == 99162322
    assert java_hash("") == 0
    assert java_hash("polygenelubricants") == -(2**31)


# -- put / get ----------------------------------------------------------------------------------


def test_put_and_get(small_config: StoreConfig) -> None:
    with MessageStore(small_config) as store:
        r0 = store.put_message(Message("T", b"a", {"TAGS": "x"}, queue_id=1))
        r1, r2 = store.put_messages([Message("T", b"b", queue_id=1), Message("U", b"c")])
        assert (r0.phys_offset, r0.queue_offset) == (0, 0)
        assert (r1.phys_offset, r1.queue_offset) == (r0.size, 1)
        assert (r2.phys_offset, r2.queue_offset) == (r0.size + r1.size, 0)
        assert store.commit_log.max_offset == r0.size + r1.size + r2.size
        assert store.wait_dispatched()
        res = store.get_messages("T", 1, 0, 32)
        assert [m.body for m in res.messages] == [b"a", b"b"]
        assert [m.queue_offset for m in res.messages] == [0, 1]
        assert [m.phys_offset for m in res.messages] == [r0.phys_offset, r1.phys_offset]
        assert res.messages[0].tags == "x"
        assert (res.next_offset, res.min_offset, res.max_offset) == (2, 0, 2)
        assert store.max_offset("T", 1) == 2 and store.min_offset("T", 1) == 0
        # Paging, and offsets past the end.
        page = store.get_messages("T", 1, 1, 1)
        assert [m.body for m in page.messages] == [b"b"] and page.next_offset == 2
        assert store.get_messages("T", 1, 0, 1).next_offset == 1
        assert store.get_messages("T", 1, 2, 10).messages == []
        # Unknown queues are empty, not errors.
        assert store.get_messages("T", 7, 0, 10).messages == []
        assert store.get_messages("Nope", 0, 0, 10).messages == []
        assert store.max_offset("Nope", 0) == 0


def test_reopen_keeps_messages_and_continues_queue_offsets(small_config: StoreConfig) -> None:
    with MessageStore(small_config) as store:
        store.put_messages([Message("T", body_of(i), queue_id=i % 2) for i in range(100)])
        store.wait_dispatched()
        before = [all_messages(store, "T", q) for q in (0, 1)]
    assert not (small_config.store_dir / "abort").exists()
    with MessageStore(small_config) as store:
        assert not store.recovery.unclean_shutdown
        assert store.recovery.stop_reason == "eof"
        assert [all_messages(store, "T", q) for q in (0, 1)] == before
        r = store.put_message(Message("T", b"after", queue_id=1))
        assert r.queue_offset == 50
        assert r.phys_offset == before[1][-1].phys_offset + before[1][-1].total_size
        store.wait_dispatched()
        assert all_messages(store, "T", 1)[-1].body == b"after"


# -- segments -----------------------------------------------------------------------------------


def test_segment_roll_names_blanks_and_order(small_config: StoreConfig) -> None:
    n = 250
    msgs = [Message("Roll", body_of(i), {"TAGS": f"t{i % 3}"}, queue_id=i % 4) for i in range(n)]
    with MessageStore(small_config) as store:
        results = []
        for k in range(0, n, 7):  # batches too, so that rolls happen inside a batch
            results += store.put_messages(msgs[k : k + 7])
        store.wait_dispatched()
        log_end = store.commit_log.max_offset
        files = log_files(small_config)
        assert len(files) >= 3
        assert [p.name for p in files] == [f"{i * SEG:020d}" for i in range(len(files))]
        assert files[0].name == "00000000000000000000"
        assert files[1].name == "00000000000000065536"
        assert all(p.stat().st_size == SEG for p in files)

        # Walk the raw bytes: messages back to back, a blank unit closing every full segment.
        seen: list[int] = []
        for idx, path in enumerate(files):
            data = path.read_bytes()
            base = idx * SEG
            pos = 0
            while True:
                if idx == len(files) - 1 and base + pos == log_end:
                    assert data[pos:] == bytes(SEG - pos)  # the rest of the last file is unused
                    break
                total = struct.unpack_from(">i", data, pos)[0]
                if data[pos + 4 : pos + 8] == BLANK_MAGIC:
                    assert idx < len(files) - 1
                    assert total == SEG - pos  # TOTALSIZE of the blank = bytes left in the file
                    assert total >= 8
                    assert data[pos + 8 :] == bytes(total - 8)
                    assert codec.check_unit(data, pos, SEG) == -total
                    break
                assert data[pos + 4 : pos + 8] == MESSAGE_MAGIC
                assert codec.check_unit(data, pos, SEG) == total
                assert struct.unpack_from(">q", data, pos + 28)[0] == base + pos  # PHYSICALOFFSET
                seen.append(base + pos)
                pos += total
        assert seen == [r.phys_offset for r in results]
        assert seen == sorted(seen)

        # Every message readable in order, with its queue offset.
        for q in range(4):
            got = all_messages(store, "Roll", q)
            want = [(i, msgs[i]) for i in range(n) if i % 4 == q]
            assert [m.body for m in got] == [m.body for _, m in want]
            assert [m.queue_offset for m in got] == list(range(len(want)))
            assert [m.phys_offset for m in got] == [results[i].phys_offset for i, _ in want]
            assert all(m.tags == f"t{i % 3}" for m, (i, _) in zip(got, want, strict=True))
    assert inspection.verify(small_config.store_dir).consistent


def test_message_filling_a_segment_to_the_last_8_bytes(small_config: StoreConfig) -> None:
    # 88 + 65000 + 3 + len("T") + len("k\x01" + v + "\x02") == SEG - 8 for len(v) == 433.
    fits = Message("T", b"b" * 65000, {"k": "v" * 433})
    too_big = Message("T", b"b" * 65000, {"k": "v" * 434})
    assert small_config.max_message_size == SEG - 8
    with MessageStore(small_config) as store:
        with pytest.raises(MessageRejected):  # could not fit even an empty segment
            store.put_message(too_big)
        assert store.commit_log.max_offset == 0
        r0 = store.put_message(fits)
        assert (r0.phys_offset, r0.size) == (0, SEG - 8)
        r1 = store.put_message(Message("T", b"next"))
        assert r1.phys_offset == SEG
    data = log_files(small_config)[0].read_bytes()
    assert data[SEG - 8 :] == struct.pack(">i", 8) + BLANK_MAGIC  # an 8-byte blank unit
    with MessageStore(small_config) as store:
        assert [m.body for m in all_messages(store, "T", 0)] == [fits.body, b"next"]


# -- ConsumeQueue files -------------------------------------------------------------------------


def test_consume_queue_raw_entries(small_config: StoreConfig) -> None:
    tags = ["TagA", "\u6807\u7b7e", "\U0001f642x", None, "", "a||b"]
    n = 150  # 64 entries per file: three files
    with MessageStore(small_config) as store:
        results = []
        for i in range(n):
            tag = tags[i % len(tags)]
            props = {"TAGS": tag} if tag is not None else {}
            results.append(store.put_message(Message("CqTopic", body_of(i, 200), props, 2)))
            store.put_message(Message("Other", b"noise"))  # interleaved log offsets
        store.wait_dispatched()
    qdir = small_config.store_dir / "consumequeue" / "CqTopic" / "2"
    files = sorted(qdir.iterdir())
    assert [p.name for p in files] == [
        "00000000000000000000",
        "00000000000000001280",
        "00000000000000002560",
    ]
    assert all(p.stat().st_size == 64 * 20 for p in files)
    raw = b"".join(p.read_bytes() for p in files)
    for i, r in enumerate(results):
        phys, size, code = struct.unpack_from(">qiq", raw, i * 20)
        tag = tags[i % len(tags)]
        assert (phys, size) == (r.phys_offset, r.size)
        assert code == (java_hash(tag) if tag else 0)
    assert raw[n * 20 :] == bytes(len(raw) - n * 20)  # nothing past the last entry
    assert (small_config.store_dir / "consumequeue" / "Other" / "0").is_dir()


# -- the store directory ----------------------------------------------------------------------


def test_store_dir_layout(small_config: StoreConfig) -> None:
    with MessageStore(small_config) as store:
        assert (small_config.store_dir / "abort").exists()
        store.put_message(Message("L", b"x", {"KEYS": "k"}))
        store.wait_dispatched()
    names = sorted(os.listdir(small_config.store_dir))
    assert {"commitlog", "consumequeue", "index", "checkpoint"} <= set(names)
    assert "abort" not in names
    assert os.path.getsize(small_config.store_dir / "checkpoint") == 4096
