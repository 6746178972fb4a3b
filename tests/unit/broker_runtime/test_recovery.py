"""Store recovery on real files: torn tails, bad CRCs, garbage, stray segments, ConsumeQueues.

Each test writes a store, stops it, damages the files the way a crash or a bad disk would,
then opens the store again (MessageStore runs recovery) and checks the report and the data.
"""

from __future__ import annotations

import dataclasses
import random
import shutil
import struct
from pathlib import Path

import pytest

from broker_runtime.common.config import FlushMode, StoreConfig
from broker_runtime.common.message import TAGS, UNIQ_KEY, Message, StoredMessage
from broker_runtime.store import inspect
from broker_runtime.store import record_codec as codec
from broker_runtime.store.checkpoint import FILE_SIZE, Checkpoint
from broker_runtime.store.commit_log import PutResult
from broker_runtime.store.consume_queue import ENTRY_SIZE
from broker_runtime.store.mapped_file import segment_name
from broker_runtime.store.message_store import MessageStore
from broker_runtime.store.segment_queue import SegmentQueue

TOPIC = "RecoveryTopic"
QUEUES = 2
SEG = 64 * 1024  # small_config's segment size


def key_of(i: int) -> str:
    return f"K{i:06d}"


def body_of(key: str) -> bytes:
    return f"<{key}>".encode() * 20


def msg(i: int) -> Message:
    key = key_of(i)
    return Message(
        topic=TOPIC,
        body=body_of(key),
        properties={UNIQ_KEY: key, TAGS: "t"},
        queue_id=i % QUEUES,
    )


def open_store(config: StoreConfig) -> MessageStore:
    return MessageStore(config, disk_ratio=lambda _path: 0.0)


def write_store(config: StoreConfig, n: int) -> list[PutResult]:
    """A store holding messages 0..n-1, stopped cleanly."""
    store = open_store(config)
    try:
        results = [store.put_message(msg(i)) for i in range(n)]
        assert store.wait_dispatched(10)
    finally:
        store.shutdown()
    return results


def log_file(config: StoreConfig, phys: int) -> tuple[Path, int]:
    """The segment holding log offset `phys`, and the position in it."""
    start = phys - phys % config.segment_size
    return Path(config.store_dir) / "commitlog" / segment_name(start), phys - start


def read_log(config: StoreConfig, phys: int, n: int) -> bytes:
    path, pos = log_file(config, phys)
    return path.read_bytes()[pos : pos + n]


def write_log(config: StoreConfig, phys: int, data: bytes) -> None:
    path, pos = log_file(config, phys)
    with path.open("r+b") as f:
        f.seek(pos)
        f.write(data)


def mark_unclean(config: StoreConfig) -> None:
    (Path(config.store_dir) / "abort").touch()


def read_queue(store: MessageStore, queue_id: int) -> list[StoredMessage]:
    r = store.get_messages(TOPIC, queue_id, 0, 10_000)
    assert r.next_offset == store.max_offset(TOPIC, queue_id)
    return r.messages


def read_all(store: MessageStore) -> list[StoredMessage]:
    return sorted(
        (m for q in range(QUEUES) for m in read_queue(store, q)), key=lambda m: m.phys_offset
    )


def assert_intact(store: MessageStore, results: list[PutResult], n: int) -> None:
    """Messages 0..n-1 readable by queue and by key, each where it was put, none else."""
    msgs = read_all(store)
    assert [m.uniq_key for m in msgs] == [key_of(i) for i in range(n)]
    for i, m in enumerate(msgs):
        assert (m.phys_offset, m.queue_offset) == (results[i].phys_offset, results[i].queue_offset)
        assert m.body == body_of(key_of(i))
    for i in (0, n // 2, n - 1):
        found = store.query_by_key(TOPIC, key_of(i))
        assert [m.phys_offset for m in found] == [results[i].phys_offset]


def recovery_dir(config: StoreConfig) -> Path:
    return Path(config.store_dir) / "recovery"


def assert_new_put_lands_at(store: MessageStore, i: int, phys: int, queue_offset: int) -> None:
    r = store.put_message(msg(i))
    assert (r.phys_offset, r.queue_offset) == (phys, queue_offset)
    assert store.wait_dispatched(10)
    assert [m.phys_offset for m in store.query_by_key(TOPIC, key_of(i))] == [phys]
    got = store.get_messages(TOPIC, i % QUEUES, queue_offset, 5).messages
    assert [(m.uniq_key, m.body) for m in got] == [(key_of(i), body_of(key_of(i)))]


def assert_consistent(config: StoreConfig) -> inspect.VerifyReport:
    report = inspect.verify(Path(config.store_dir))
    assert report.consistent, report.as_dict()
    return report


# -- the checkpoint ----------------------------------------------------------------------------


def test_checkpoint_file_layout(small_config: StoreConfig) -> None:
    results = write_store(small_config, 10)
    path = Path(small_config.store_dir) / "checkpoint"
    raw = path.read_bytes()
    assert len(raw) == FILE_SIZE == 4096
    phys_ts, logics_ts, index_ts, phys_flushed, logics_flushed = struct.unpack_from(">5q", raw)
    assert raw[40:] == bytes(4096 - 40)
    end = results[-1].phys_offset + results[-1].size
    assert phys_flushed == logics_flushed == end
    assert phys_ts == logics_ts == index_ts == results[-1].store_timestamp
    assert Checkpoint.load(path) == Checkpoint(phys_ts, logics_ts, index_ts, end, end)

    cp = Checkpoint(1, 2, 3, 4, 5)
    cp.save(path)
    assert path.stat().st_size == 4096
    assert path.read_bytes()[:40] == struct.pack(">qqqqq", 1, 2, 3, 4, 5)
    assert Checkpoint.load(path) == cp
    path.write_bytes(b"\x00" * 39)
    assert Checkpoint.load(path) is None
    assert Checkpoint.load(path.with_name("missing")) is None


# -- clean starts ------------------------------------------------------------------------------


def test_clean_restart_repairs_nothing(small_config: StoreConfig) -> None:
    results = write_store(small_config, 30)
    store = open_store(small_config)
    try:
        r = store.recovery
        assert r.unclean_shutdown is False
        assert (r.truncated_bytes, r.saved, r.consume_queue_entries_dropped) == (0, [], 0)
        assert r.stop_reason == "eof"
        assert r.index_truncated is False
        assert r.log_end == results[-1].phys_offset + results[-1].size
        assert store.abort_file.exists()  # until the clean stop
        assert_intact(store, results, 30)
    finally:
        store.shutdown()
    assert not (Path(small_config.store_dir) / "abort").exists()
    assert not recovery_dir(small_config).exists()


def test_fresh_store_reports_no_index_truncation(small_config: StoreConfig) -> None:
    store = open_store(small_config)
    try:
        assert store.recovery.truncated_bytes == 0
        assert store.recovery.index_truncated is False
    finally:
        store.shutdown()


# -- torn tails --------------------------------------------------------------------------------


def test_last_message_cut_in_half_is_truncated(small_config: StoreConfig) -> None:
    n = 30
    results = write_store(small_config, n)
    last = results[-1]
    unit = read_log(small_config, last.phys_offset, last.size)
    half = last.size // 2
    write_log(small_config, last.phys_offset + half, bytes(last.size - half))  # lost 2nd half
    mark_unclean(small_config)

    store = open_store(small_config)
    try:
        r = store.recovery
        kept = unit[:half].rstrip(b"\0")
        assert r.unclean_shutdown is True
        assert r.stop_reason in ("bad_lengths", "bad_crc")
        assert r.log_end == last.phys_offset == store.commit_log.max_offset
        assert r.truncated_bytes == len(kept) > 0
        torn = recovery_dir(small_config) / f"{segment_name(last.phys_offset)}.torn"
        assert r.saved == [str(torn)]
        assert torn.read_bytes() == kept
        path, pos = log_file(small_config, last.phys_offset)
        assert path.read_bytes()[pos:] == bytes(SEG - pos)  # zeroed on disk
        assert r.consume_queue_entries_dropped == 1
        assert r.index_truncated is True

        assert store.message_at(last.phys_offset) is None
        assert store.query_by_key(TOPIC, key_of(n - 1)) == []
        assert store.max_offset(TOPIC, (n - 1) % QUEUES) == last.queue_offset
        assert_intact(store, results, n - 1)
        assert_new_put_lands_at(store, n + 1, last.phys_offset, last.queue_offset)  # same queue
    finally:
        store.shutdown()
    assert_consistent(small_config)


def test_half_a_unit_after_the_last_message_is_truncated(small_config: StoreConfig) -> None:
    n = 30
    results = write_store(small_config, n)
    end = results[-1].phys_offset + results[-1].size
    unit = read_log(small_config, results[-1].phys_offset, results[-1].size)  # a valid unit
    half = unit[: len(unit) // 2]
    write_log(small_config, end, half)
    mark_unclean(small_config)

    store = open_store(small_config)
    try:
        r = store.recovery
        assert r.stop_reason in ("bad_lengths", "bad_crc")
        assert r.log_end == end
        assert r.truncated_bytes == len(half.rstrip(b"\0")) > 0
        torn = recovery_dir(small_config) / f"{segment_name(end)}.torn"
        assert r.saved == [str(torn)]
        assert torn.read_bytes() == half.rstrip(b"\0")
        assert r.consume_queue_entries_dropped == 0  # it was never dispatched
        assert store.message_at(end) is None
        assert_intact(store, results, n)
        assert_new_put_lands_at(store, n, end, results[-2].queue_offset + 1)
    finally:
        store.shutdown()
    assert_consistent(small_config)


@pytest.mark.parametrize("unclean", [True, False], ids=["abort-file", "clean-stop"])
def test_bad_crc_in_the_last_message_truncates_from_it(
    small_config: StoreConfig, unclean: bool
) -> None:
    n = 30
    results = write_store(small_config, n)
    last = results[-1]
    at = last.phys_offset + codec.HEADER_SIZE + 7  # a body byte
    write_log(small_config, at, bytes([read_log(small_config, at, 1)[0] ^ 0x20]))
    damaged = read_log(small_config, last.phys_offset, last.size)
    if unclean:
        mark_unclean(small_config)

    store = open_store(small_config)
    try:
        r = store.recovery
        assert r.unclean_shutdown is unclean
        assert r.stop_reason == "bad_crc"
        assert r.log_end == last.phys_offset
        assert r.truncated_bytes == last.size
        torn = recovery_dir(small_config) / f"{segment_name(last.phys_offset)}.torn"
        assert torn.read_bytes() == damaged
        assert r.consume_queue_entries_dropped == 1
        assert store.message_at(last.phys_offset) is None
        assert store.query_by_key(TOPIC, key_of(n - 1)) == []
        assert_intact(store, results, n - 1)
        assert_new_put_lands_at(store, n + 1, last.phys_offset, last.queue_offset)  # same queue
    finally:
        store.shutdown()
    assert_consistent(small_config)


def test_bad_crc_before_the_checkpoint_is_never_read_as_valid(small_config: StoreConfig) -> None:
    n = 500  # ~2.5 segments: the checkpoint is in the third, the damage in the first
    results = write_store(small_config, n)
    victim = 17
    bad = results[victim]
    assert bad.phys_offset < SEG <= results[-1].phys_offset - SEG
    at = bad.phys_offset + codec.HEADER_SIZE + 3
    write_log(small_config, at, bytes([read_log(small_config, at, 1)[0] ^ 0x01]))

    report = inspect.verify(Path(small_config.store_dir))
    assert report.bad_crcs == 1
    assert report.consistent is False
    assert report.messages == n  # the scan of `verify` goes on past a bad CRC
    assert [p.kind for p in report.problems] == ["bad_crc"]
    assert report.problems[0].where == f"{segment_name(0)}+{bad.phys_offset}"

    mark_unclean(small_config)
    store = open_store(small_config)
    try:
        r = store.recovery
        assert r.scanned_from >= SEG  # the damage lies before what recovery checks
        assert (r.truncated_bytes, r.saved, r.consume_queue_entries_dropped) == (0, [], 0)
        assert r.log_end == results[-1].phys_offset + results[-1].size
        assert store.message_at(bad.phys_offset) is None
        assert store.query_by_key(TOPIC, key_of(victim)) == []
        assert store.message_at(results[victim + 1].phys_offset) is not None
        # get_messages does not check CRCs (neither does RocketMQ's getMessage), but what it
        # returns carries the stored BODYCRC, so a reader can see the body does not match.
        got = store.get_messages(TOPIC, victim % QUEUES, bad.queue_offset, 1).messages
        assert [m.phys_offset for m in got] == [bad.phys_offset]
        assert codec.body_crc(got[0].body) != got[0].body_crc
    finally:
        store.shutdown()


@pytest.mark.parametrize("gap", [0, 40], ids=["right-after", "after-zeros"])
def test_garbage_after_the_last_message_never_yields_a_message(
    small_config: StoreConfig, gap: int
) -> None:
    n = 30
    results = write_store(small_config, n)
    end = results[-1].phys_offset + results[-1].size
    rng = random.Random(20240611)
    garbage = bytes(rng.randrange(1, 256) for _ in range(1000))
    write_log(small_config, end + gap, garbage)
    mark_unclean(small_config)

    store = open_store(small_config)
    try:
        r = store.recovery
        assert r.stop_reason == ("bad_magic" if gap == 0 else "eof")
        assert r.log_end == end
        assert r.truncated_bytes == gap + len(garbage)
        torn = recovery_dir(small_config) / f"{segment_name(end)}.torn"
        assert r.saved == [str(torn)]
        assert torn.read_bytes() == bytes(gap) + garbage
        assert read_log(small_config, end, gap + len(garbage)) == bytes(gap + len(garbage))
        assert sum(1 for _ in store.commit_log.scan(0)) == n
        assert store.message_at(end) is None
        assert store.message_at(end + gap) is None
        assert_intact(store, results, n)
        assert_new_put_lands_at(store, n, end, results[-2].queue_offset + 1)
    finally:
        store.shutdown()
    assert sum(1 for _ in inspect.dump(Path(small_config.store_dir))) == n + 1
    assert_consistent(small_config)


@pytest.mark.parametrize("torn", [False, True], ids=["clean-end", "torn-end"])
def test_segment_after_the_end_of_the_log_is_moved_aside(
    small_config: StoreConfig, torn: bool
) -> None:
    n = 30
    results = write_store(small_config, n)
    end = results[-1].phys_offset + results[-1].size
    assert end < SEG
    unit = bytearray(read_log(small_config, results[0].phys_offset, results[0].size))
    tail = b""
    if torn:  # the log ends in half a unit, which is cut together with what follows
        tail = bytes(unit[: len(unit) // 2])
        write_log(small_config, end, tail)
    # A following segment holding a valid-looking message (its PHYSICALOFFSET says SEG).
    struct.pack_into(">q", unit, 28, SEG)
    stray = Path(small_config.store_dir) / "commitlog" / segment_name(SEG)
    stray.write_bytes(bytes(unit) + bytes(SEG - len(unit)))
    mark_unclean(small_config)

    store = open_store(small_config)
    try:
        r = store.recovery
        moved = recovery_dir(small_config) / f"{segment_name(SEG)}.segment"
        torn_file = recovery_dir(small_config) / f"{segment_name(end)}.torn"
        assert r.saved == [str(moved)] + ([str(torn_file)] if torn else [])
        assert not stray.exists()
        assert moved.read_bytes()[: len(unit)] == unit
        assert r.truncated_bytes == len(unit) + len(tail)
        if torn:
            assert torn_file.read_bytes() == tail
        assert r.log_end == end == store.commit_log.max_offset
        assert [f.file_from_offset for f in store.commit_log.segments.files] == [0]
        assert store.message_at(SEG) is None
        assert_intact(store, results, n)
        assert_new_put_lands_at(store, n, end, results[-2].queue_offset + 1)
    finally:
        store.shutdown()
    assert_consistent(small_config)


# -- ConsumeQueues -----------------------------------------------------------------------------


def test_consume_queue_entries_past_the_log_end_are_dropped(small_config: StoreConfig) -> None:
    n, lost = 40, 5
    results = write_store(small_config, n)
    cut = results[n - lost].phys_offset
    end = results[-1].phys_offset + results[-1].size
    write_log(small_config, cut, bytes(end - cut))  # the log lost its tail, the CQs did not
    mark_unclean(small_config)

    store = open_store(small_config)
    try:
        r = store.recovery
        assert r.stop_reason == "eof"
        assert (r.truncated_bytes, r.saved) == (0, [])
        assert r.log_end == cut
        assert r.consume_queue_entries_dropped == lost
        for q in range(QUEUES):
            assert store.max_offset(TOPIC, q) == sum(1 for i in range(n - lost) if i % QUEUES == q)
        for i in range(n - lost, n):
            assert store.query_by_key(TOPIC, key_of(i)) == []
        assert_intact(store, results, n - lost)
        first_lost = results[n - lost]
        assert_new_put_lands_at(store, n - lost, cut, first_lost.queue_offset)
    finally:
        store.shutdown()
    assert_consistent(small_config)


@pytest.mark.parametrize("zeroed", [3, 10], ids=["inside-a-file", "across-files"])
def test_missing_consume_queue_tail_is_rebuilt(small_config: StoreConfig, zeroed: int) -> None:
    n = 140  # 70 entries per queue: with 64 entries per CQ file, queue 0 has two files
    results = write_store(small_config, n)
    per_file = small_config.cq_entries_per_file
    qdir = Path(small_config.store_dir) / "consumequeue" / TOPIC / "0"
    assert sorted(p.name for p in qdir.iterdir()) == [
        segment_name(0),
        segment_name(per_file * ENTRY_SIZE),
    ]
    for qo in range(70 - zeroed, 70):
        path = qdir / segment_name(qo // per_file * per_file * ENTRY_SIZE)
        with path.open("r+b") as f:
            f.seek(qo % per_file * ENTRY_SIZE)
            f.write(bytes(ENTRY_SIZE))
    before = inspect.verify(Path(small_config.store_dir))
    assert before.consume_queue_missing == zeroed
    mark_unclean(small_config)

    store = open_store(small_config)
    try:
        r = store.recovery
        assert (r.truncated_bytes, r.consume_queue_entries_dropped) == (0, 0)
        assert r.redispatched_messages >= zeroed
        assert store.wait_dispatched(10)
        assert store.max_offset(TOPIC, 0) == 70
        assert_intact(store, results, n)
        assert_new_put_lands_at(store, n, results[-1].phys_offset + results[-1].size, 70)
    finally:
        store.shutdown()
    assert_consistent(small_config)


# -- idempotence -------------------------------------------------------------------------------


def test_recovery_is_idempotent(small_config: StoreConfig) -> None:
    n = 30
    results = write_store(small_config, n)
    end = results[-1].phys_offset + results[-1].size
    write_log(small_config, end, b"\xff" * 100)
    mark_unclean(small_config)
    store = open_store(small_config)
    store.shutdown()
    assert store.recovery.truncated_bytes == 100
    saved = sorted(recovery_dir(small_config).iterdir())
    files = {p.name: p.read_bytes() for p in (Path(small_config.store_dir) / "commitlog").iterdir()}

    for unclean in (True, False):  # again after a crash with nothing new, and after a clean stop
        if unclean:
            mark_unclean(small_config)
        store = open_store(small_config)
        try:
            r = store.recovery
            assert r.unclean_shutdown is unclean
            assert (r.truncated_bytes, r.saved, r.consume_queue_entries_dropped) == (0, [], 0)
            assert r.stop_reason == "eof"
            assert r.index_truncated is False
            assert r.log_end == end
            assert_intact(store, results, n)
        finally:
            store.shutdown()
        assert sorted(recovery_dir(small_config).iterdir()) == saved
        assert {
            p.name: p.read_bytes() for p in (Path(small_config.store_dir) / "commitlog").iterdir()
        } == files
    assert_consistent(small_config)


# -- what the checkpoint claims as flushed -----------------------------------------------------


def _quiet(config: StoreConfig) -> StoreConfig:
    """ASYNC_FLUSH with background flushes far away: the test decides when to flush."""
    return dataclasses.replace(
        config, flush=FlushMode.ASYNC, flush_interval_ms=3_600_000, cq_flush_interval_ms=3_600_000
    )


def _fill_past_a_roll(store: MessageStore) -> int:
    """Put messages, flush the log, put more until the log rolls; returns the flushed end."""
    i = 0
    while store.commit_log.max_offset < SEG // 2:
        store.put_message(msg(i))
        i += 1
    durable = store.commit_log.segments.flush()
    assert durable == store.commit_log.max_offset
    while store.commit_log.max_offset < SEG + 500:
        store.put_message(msg(i))
        i += 1
    assert store.wait_dispatched(10)
    return durable


def test_checkpoint_never_claims_unflushed_log_bytes(small_config: StoreConfig) -> None:
    store = open_store(_quiet(small_config))
    try:
        durable = _fill_past_a_roll(store)
        store.flush_logics()  # the periodic checkpoint, before the next periodic log flush
        cp = Checkpoint.load(Path(small_config.store_dir) / "checkpoint")
        assert cp is not None
        assert cp.phys_flushed_offset <= durable
    finally:
        store.shutdown()


def test_flush_result_covers_only_fsynced_bytes(tmp_path: Path) -> None:
    q = SegmentQueue(tmp_path / "log", 4096)
    try:
        f0 = q.last_file()
        f0.append(b"a" * 1000)
        fsync_f0 = f0.flush

        def flush_then_a_put_rolls() -> int:
            done = fsync_f0()  # the flusher thread is done with f0 ...
            f0.append(b"b" * 3096)  # ... when a put fills it and rolls to f1
            q.last_file().append(b"c" * 10)
            return done

        f0.flush = flush_then_a_put_rolls  # type: ignore[method-assign]
        flushed = q.flush()
        assert f0.flushed_position == 1000  # bytes 1000..4095 of f0 were never fsynced
        assert flushed <= 1000
    finally:
        q.close()


def test_power_loss_after_a_roll_serves_no_lost_message(
    small_config: StoreConfig, tmp_path: Path
) -> None:
    config = _quiet(small_config)
    store = open_store(config)
    try:
        durable = _fill_past_a_roll(store)
        store.flush_logics()  # periodic checkpoint: ConsumeQueues and index are fsynced
        crashed = tmp_path / "crashed"
        shutil.copytree(config.store_dir, crashed)  # what the page cache holds at the crash
    finally:
        store.shutdown()
    # Power loss: the log bytes written after the last log flush never reached the disk.
    log = crashed / "commitlog"
    seg0 = bytearray((log / segment_name(0)).read_bytes())
    seg0[durable:] = bytes(SEG - durable)
    (log / segment_name(0)).write_bytes(bytes(seg0))
    (log / segment_name(SEG)).write_bytes(bytes(SEG))

    config = dataclasses.replace(config, store_dir=crashed)
    store = open_store(config)
    try:
        assert store.recovery.unclean_shutdown is True
        assert store.wait_dispatched(10)
        msgs = read_all(store)
        junk = [m for m in msgs if m.topic != TOPIC or m.body != body_of(m.uniq_key or "")]
        assert not junk, f"{len(junk)} ConsumeQueue entries served lost log bytes as messages"
        assert all(m.phys_offset + m.total_size <= durable for m in msgs)
        assert store.commit_log.max_offset == durable
    finally:
        store.shutdown()
    assert_consistent(config)
