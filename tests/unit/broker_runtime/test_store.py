"""MessageStore end to end on real files: put/get, segment rolls, ConsumeQueue bytes, rebuilds,
queries, names and sizes refused, SYNC_FLUSH group commit."""

from __future__ import annotations

import dataclasses
import os
import shutil
import struct
import threading
from pathlib import Path

import pytest

from broker_runtime.common.clock import FakeClock
from broker_runtime.common.config import FlushMode, StoreConfig
from broker_runtime.common.message import Message, StoredMessage, offset_msg_id
from broker_runtime.common.topics import InvalidNameError
from broker_runtime.store import inspect
from broker_runtime.store import record_codec as codec
from broker_runtime.store.message_store import GetResult, MessageStore
from broker_runtime.store.record_codec import MessageRejected

SEG = 64 * 1024
T0 = 1_700_000_000_000
BLANK_MAGIC = bytes.fromhex("CBD43194")
MESSAGE_MAGIC = bytes.fromhex("DAA320A7")


def java_hash(s: str) -> int:
    """Java's String.hashCode over UTF-16 code units, written independently of the store."""
    data = s.encode("utf-16-be")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i : i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def body_of(i: int, size: int = 1000) -> bytes:
    head = f"msg-{i:06d}|".encode()
    return head + bytes((i + k) % 251 for k in range(size - len(head)))


def log_files(cfg: StoreConfig) -> list[Path]:
    return sorted((cfg.store_dir / "commitlog").iterdir())


def all_messages(store: MessageStore, topic: str, queue_id: int) -> list[StoredMessage]:
    return store.get_messages(topic, queue_id, 0, 1_000_000).messages


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
    assert inspect.verify(small_config.store_dir).consistent


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


# -- rebuilds -----------------------------------------------------------------------------------


def populate(store: MessageStore, clock: FakeClock, n: int = 300) -> list[Message]:
    msgs = []
    for i in range(n):
        topic = "RbA" if i % 3 else "RbB"
        m = Message(
            topic,
            body_of(i, 600),
            {"TAGS": f"tag{i % 5}", "KEYS": f"order-{i} cust-{i % 7}", "UNIQ_KEY": f"U{i:08X}"},
            queue_id=i % 4,
        )
        msgs.append(m)
        store.put_message(m)
        if i % 10 == 9:
            clock.advance(1000)
    store.wait_dispatched()
    return msgs


QUEUES = [(t, q) for t in ("RbA", "RbB") for q in range(4)]
KEYS = (
    [f"order-{i}" for i in range(0, 300, 17)]
    + [f"cust-{k}" for k in range(7)]
    + [f"U{i:08X}" for i in range(0, 300, 23)]
)


Snapshot = tuple[
    dict[tuple[str, int], GetResult],
    dict[tuple[str, str], list[StoredMessage]],
    dict[str, list[StoredMessage]],
]


def snapshot(store: MessageStore) -> Snapshot:
    gets = {tq: store.get_messages(*tq, 0, 10_000) for tq in QUEUES}
    queries = {
        (t, k): store.query_by_key(t, k, max_count=1000) for t in ("RbA", "RbB") for k in KEYS
    }
    windows = {
        k: store.query_by_key("RbA", k, 1000, T0 + 5000, T0 + 12_000) for k in ("cust-1", "cust-3")
    }
    return gets, queries, windows


def files_under(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.mark.parametrize(
    "deleted", [("consumequeue", "index"), ("index",), ("consumequeue",)], ids="+".join
)
def test_rebuild_from_the_log(small_config: StoreConfig, deleted: tuple[str, ...]) -> None:
    clock = FakeClock(start_ms=T0)
    root = small_config.store_dir
    with MessageStore(small_config, clock=clock) as store:
        populate(store, clock)
        before = snapshot(store)
    assert len(log_files(small_config)) >= 3
    assert len(list((root / "index").iterdir())) >= 2  # several index files to rebuild
    gets, queries, windows = before
    assert sum(len(g.messages) for g in gets.values()) == 300
    for k in KEYS:  # each key was found in the topic it was written to
        assert queries[("RbA", k)] or queries[("RbB", k)]
    for found in windows.values():
        assert found and all(T0 + 5000 <= m.store_timestamp <= T0 + 12_000 for m in found)
    saved = {d: files_under(root / d) for d in deleted}
    for d in deleted:
        shutil.rmtree(root / d)
    with MessageStore(small_config, clock=clock) as store:
        assert store.recovery.redispatched_messages == 300  # everything read back from the log
        assert snapshot(store) == before
    for d in deleted:  # rebuilt byte for byte
        assert files_under(root / d) == saved[d]
    report = inspect.verify(root)
    assert report.consistent, report.problems
    assert report.messages == 300 and report.consume_queue_entries == 300


# -- queries ------------------------------------------------------------------------------------


def test_query_by_key_keys_uniq_key_and_time_bounds(small_config: StoreConfig) -> None:
    clock = FakeClock(start_ms=T0)
    with MessageStore(small_config, clock=clock) as store:
        rs = []
        for i in range(4):
            props = {"KEYS": f"order-{i} shared", "UNIQ_KEY": f"UNIQ{i}"}
            rs.append(store.put_message(Message("Q", f"m{i}".encode(), props)))
            clock.advance(10_000)
        store.put_message(Message("Q2", b"other", {"KEYS": "shared order-1"}))
        store.wait_dispatched()

        def bodies(key: str, **kw: int) -> list[bytes]:
            return [m.body for m in store.query_by_key("Q", key, **kw)]

        assert bodies("shared") == [b"m3", b"m2", b"m1", b"m0"]  # newest first
        assert bodies("order-2") == [b"m2"]
        assert bodies("UNIQ1") == [b"m1"]
        assert bodies("shared", max_count=2) == [b"m3", b"m2"]
        assert bodies("shared", begin_ms=T0 + 10_000, end_ms=T0 + 20_000) == [b"m2", b"m1"]
        assert bodies("shared", begin_ms=T0 + 10_001, end_ms=T0 + 19_999) == []
        assert bodies("UNIQ0", begin_ms=T0 + 1) == []
        assert bodies("UNIQ3", end_ms=T0 + 29_999) == []
        assert bodies("UNIQ3", begin_ms=T0 + 30_000, end_ms=T0 + 30_000) == [b"m3"]
        assert bodies("order-1 shared") == []  # KEYS are split on spaces
        assert bodies("order") == [] and bodies("shar") == []
        assert bodies("nothing") == []
        assert [m.body for m in store.query_by_key("Q2", "shared")] == [b"other"]
        assert [m.body for m in store.query_by_key("Q2", "order-1")] == [b"other"]
        assert store.query_by_key("Q3", "shared") == []
        got = store.query_by_key("Q", "order-0")
        assert got[0].phys_offset == rs[0].phys_offset and got[0].store_timestamp == T0
        with pytest.raises(InvalidNameError):
            store.query_by_key("../Q", "shared")


def test_message_by_id(small_config: StoreConfig) -> None:
    cfg = dataclasses.replace(small_config, store_host=("10.0.0.7", 10911))
    with MessageStore(cfg) as store:
        rs = store.put_messages([Message("T", body_of(i, 3000)) for i in range(60)])
        store.wait_dispatched()
        stored = all_messages(store, "T", 0)
        assert rs[-1].phys_offset >= SEG  # some ids point into the second segment
        for r, m in zip(rs, stored, strict=True):
            msg_id = offset_msg_id(("10.0.0.7", 10911), r.phys_offset)
            assert msg_id == "0A000007" + "00002A9F" + f"{r.phys_offset:016X}"
            assert m.msg_id == msg_id
            assert store.message_by_id(msg_id) == m
        end = store.commit_log.max_offset
        assert store.message_by_id(offset_msg_id(cfg.store_host, end)) is None
        assert store.message_by_id(offset_msg_id(cfg.store_host, 10 * SEG)) is None
        assert store.message_by_id(offset_msg_id(cfg.store_host, rs[1].phys_offset + 1)) is None
        with pytest.raises(ValueError):
            store.message_by_id("XYZ")


@pytest.mark.parametrize("blank_len", [16, 500])  # shorter and longer than a unit header
def test_message_by_id_at_a_blank_unit_is_none(small_config: StoreConfig, blank_len: int) -> None:
    with MessageStore(small_config) as store:
        while SEG - store.commit_log.max_offset > 3000:
            store.put_message(Message("T", body_of(0)))
        size = SEG - store.commit_log.max_offset - blank_len  # 88 + body + 3 + len("T")
        store.put_message(Message("T", b"f" * (size - 92)))
        assert store.put_message(Message("T", body_of(1))).phys_offset == SEG
        blank_at = SEG - blank_len
        assert store.commit_log.read(blank_at, 8) == struct.pack(">i", blank_len) + BLANK_MAGIC
        assert store.message_at(blank_at) is None
        assert store.message_by_id(offset_msg_id(small_config.store_host, blank_at)) is None


# -- refused writes -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "topic", ["../x", "", "a" * 128, "t\u00f3pico", "a b", "x\n", "a/b", ".", "T\x00"]
)
def test_bad_topic_names_are_refused(small_config: StoreConfig, topic: str) -> None:
    with MessageStore(small_config) as store:
        store.put_message(Message("Good", b"first"))
        end = store.commit_log.max_offset
        with pytest.raises(InvalidNameError):
            store.put_message(Message(topic, b"x"))
        with pytest.raises(InvalidNameError):
            store.put_messages([Message("Good", b"ok"), Message(topic, b"x")])
        with pytest.raises(InvalidNameError):
            store.get_messages(topic, 0, 0, 1)
        assert store.commit_log.max_offset == end
        store.wait_dispatched()
        assert store.max_offset("Good", 0) == 1
    assert [p.name for p in (small_config.store_dir / "consumequeue").iterdir()] == ["Good"]
    data = log_files(small_config)[0].read_bytes()
    assert data[end:] == bytes(len(data) - end)
    assert not (small_config.store_dir.parent / "x").exists()


def test_topic_length_limit_is_127(small_config: StoreConfig) -> None:
    with MessageStore(small_config) as store:
        r = store.put_message(Message("a" * 127, b"x"))
        store.wait_dispatched()
        assert all_messages(store, "a" * 127, 0)[0].phys_offset == r.phys_offset


def test_body_over_max_message_size_is_refused(tmp_path: Path) -> None:
    cfg = StoreConfig(store_dir=tmp_path / "s", segment_size=8 * 1024 * 1024)
    assert cfg.max_message_size == 4 * 1024 * 1024
    with MessageStore(cfg) as store:
        store.put_message(Message("Big", b"small"))
        end = store.commit_log.max_offset
        with pytest.raises(MessageRejected):
            store.put_message(Message("Big", b"\x01" * (4 * 1024 * 1024 + 1)))
        with pytest.raises(MessageRejected):
            store.put_messages([Message("Big", b"ok"), Message("Big", bytes(4 * 1024 * 1024 + 1))])
        assert store.commit_log.max_offset == end
        with pytest.raises(MessageRejected):  # the limit is on the whole unit (94 bytes here)
            store.put_message(Message("Big", b"\x02" * (4 * 1024 * 1024 - 93)))
        limit = b"\x02" * (4 * 1024 * 1024 - 94)  # a unit of exactly maxMessageSize is accepted
        r = store.put_message(Message("Big", limit))
        assert r.queue_offset == 1
        store.wait_dispatched()
        assert [m.body for m in all_messages(store, "Big", 0)] == [b"small", limit]


def test_max_message_size_is_clamped_to_the_segment(tmp_path: Path) -> None:
    cfg = StoreConfig(store_dir=tmp_path / "s", segment_size=64 * 1024)
    assert cfg.max_message_size == 64 * 1024 - 8
    with MessageStore(cfg) as store:
        with pytest.raises(MessageRejected):
            store.put_message(Message("T", bytes(64 * 1024 - 8 - 91)))  # a 65529-byte unit
        assert store.commit_log.max_offset == 0
        store.put_message(Message("T", bytes(64 * 1024 - 8 - 92)))


def test_bad_header_int_rejects_the_whole_batch(small_config: StoreConfig) -> None:
    with MessageStore(small_config) as store:
        while SEG - store.commit_log.max_offset > 2000:
            store.put_message(Message("T", body_of(0)))
        store.put_message(Message("T", b"p" * (SEG - store.commit_log.max_offset - 400 - 92)))
        end = store.commit_log.max_offset
        assert SEG - end == 400
        store.wait_dispatched()
        count = store.max_offset("T", 0)
        # At 4a62814 the bad int failed inside CommitLog.put after the first message and the
        # blank had been written (visible after a restart) and queue offsets had been taken.
        batch = [
            Message("T", b"fits-before-roll"),
            Message("T", b"needs-a-roll" * 50),
            Message("T", b"bad", flag=2**31),
        ]
        with pytest.raises(MessageRejected):
            store.put_messages(batch)
        assert store.commit_log.max_offset == end  # nothing of the batch was written
        assert store.put_message(Message("T", b"next")).queue_offset == count  # no gap
    with MessageStore(small_config) as store:
        assert [m.body for m in store.get_messages("T", 0, count, 10).messages] == [b"next"]


# -- SYNC_FLUSH ---------------------------------------------------------------------------------


def test_sync_flush_puts_are_fsynced(small_config: StoreConfig) -> None:
    cfg = dataclasses.replace(small_config, flush=FlushMode.SYNC)
    with MessageStore(cfg) as store:
        assert store.group_commit_stats == (0, 0)
        for i in range(5):
            r = store.put_message(Message("S", body_of(i, 100)))
            assert store.commit_log.segments.flushed_offset >= r.phys_offset + r.size
        puts, fsyncs = store.group_commit_stats
        assert puts == 5
        assert 0 < fsyncs <= 5
    with MessageStore(small_config) as store:  # ASYNC: no group commit at all
        store.put_message(Message("S", b"x"))
        assert store.group_commit_stats == (0, 0)


def test_sync_flush_concurrent_puts_share_fsyncs(small_config: StoreConfig) -> None:
    cfg = dataclasses.replace(small_config, flush=FlushMode.SYNC)
    threads_n, per_thread, queues = 16, 40, 4
    results: dict[int, list[tuple[int, int, int]]] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(threads_n)
    with MessageStore(cfg) as store:

        def worker(t: int) -> None:
            try:
                start.wait()
                out = []
                for i in range(per_thread):
                    q = (t + i) % queues
                    r = store.put_message(Message("Sync", f"{t}:{i}".encode(), queue_id=q))
                    out.append((q, r.queue_offset, r.phys_offset))
                results[t] = out
            except BaseException as e:  # pragma: no cover - reported below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(threads_n)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errors
        puts, fsyncs = store.group_commit_stats
        total = threads_n * per_thread
        assert puts == total
        assert 0 < fsyncs < puts  # puts_per_fsync > 1
        assert store.commit_log.segments.flushed_offset == store.commit_log.max_offset
        store.wait_dispatched()
        by_queue: dict[int, list[int]] = {}
        for out in results.values():
            for q, qo, _ in out:
                by_queue.setdefault(q, []).append(qo)
        for q in range(queues):
            got = all_messages(store, "Sync", q)
            assert sorted(by_queue[q]) == list(range(len(by_queue[q])))  # unique, contiguous
            assert [m.queue_offset for m in got] == list(range(len(by_queue[q])))
        bodies = {m.body for q in range(queues) for m in all_messages(store, "Sync", q)}
        assert bodies == {f"{t}:{i}".encode() for t in range(threads_n) for i in range(per_thread)}
        # Each thread's own puts are in log order.
        for out in results.values():
            phys = [p for _, _, p in out]
            assert phys == sorted(phys)
    assert inspect.verify(cfg.store_dir).consistent


def test_store_dir_layout(small_config: StoreConfig) -> None:
    with MessageStore(small_config) as store:
        assert (small_config.store_dir / "abort").exists()
        store.put_message(Message("L", b"x", {"KEYS": "k"}))
        store.wait_dispatched()
    names = sorted(os.listdir(small_config.store_dir))
    assert {"commitlog", "consumequeue", "index", "checkpoint"} <= set(names)
    assert "abort" not in names
    assert os.path.getsize(small_config.store_dir / "checkpoint") == 4096
