"""Store recovery on real files: the checkpoint, clean starts, ConsumeQueue repair, idempotence.

Each test writes a store, stops it (or damages it the way a crash or a bad disk would), then
opens the store again (MessageStore runs recovery) and checks the report and the data.
"""

from __future__ import annotations

import dataclasses
import shutil
import struct
from pathlib import Path

import pytest

from broker_runtime.common.config import FlushMode, StoreConfig
from broker_runtime.common.message import KEYS, TAGS, UNIQ_KEY, Message
from broker_runtime.store import inspection
from broker_runtime.store.checkpoint import FILE_SIZE, Checkpoint
from broker_runtime.store.consume_queue import ENTRY_SIZE
from broker_runtime.store.mapped_file import segment_name
from broker_runtime.store.message_store import MessageStore
from broker_runtime.store.segment_queue import SegmentQueue
from tests.unit.broker_runtime.recovery_helpers import (
    QUEUES,
    TOPIC,
    assert_intact,
    assert_new_put_lands_at,
    body_of,
    end_of,
    key_of,
    mark_unclean,
    msg,
    read_all,
    recovery_dir,
    write_log,
    write_store,
)
from tests.unit.broker_runtime.store_helpers import (
    SEG,
    assert_consistent,
    open_store,
    opened,
    recovered,
)

# -- the checkpoint ----------------------------------------------------------------------------


def test_checkpoint_file_layout(small_config: StoreConfig) -> None:
    results = write_store(small_config, 10)
    path = Path(small_config.store_dir) / "checkpoint"
    raw = path.read_bytes()
    assert len(raw) == FILE_SIZE == 4096
    phys_ts, logics_ts, index_ts, phys_flushed, logics_flushed = struct.unpack_from(">5q", raw)
    assert raw[40:] == bytes(4096 - 40)
    end = end_of(results)
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
    with opened(small_config) as store:
        r = store.recovery
        assert r.unclean_shutdown is False
        assert (r.truncated_bytes, r.saved, r.consume_queue_entries_dropped) == (0, [], 0)
        assert r.stop_reason == "eof"
        assert r.index_truncated is False
        assert r.log_end == results[-1].phys_offset + results[-1].size
        assert store.abort_file.exists()  # until the clean stop
        assert_intact(store, results, 30)
    assert not (Path(small_config.store_dir) / "abort").exists()
    assert not recovery_dir(small_config).exists()


def test_fresh_store_reports_no_index_truncation(small_config: StoreConfig) -> None:
    with opened(small_config) as store:
        assert store.recovery.truncated_bytes == 0
        assert store.recovery.index_truncated is False


# -- ConsumeQueues -----------------------------------------------------------------------------


def test_consume_queue_entries_past_the_log_end_are_dropped(small_config: StoreConfig) -> None:
    n, lost = 40, 5
    results = write_store(small_config, n)
    cut = results[n - lost].phys_offset
    end = end_of(results)
    write_log(small_config, cut, bytes(end - cut))  # the log lost its tail, the CQs did not
    mark_unclean(small_config)

    with recovered(small_config) as store:
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
    before = inspection.verify(Path(small_config.store_dir))
    assert before.consume_queue_missing == zeroed
    mark_unclean(small_config)

    with recovered(small_config) as store:
        r = store.recovery
        assert (r.truncated_bytes, r.consume_queue_entries_dropped) == (0, 0)
        assert r.redispatched_messages >= zeroed
        assert store.wait_dispatched(10)
        assert store.max_offset(TOPIC, 0) == 70
        assert_intact(store, results, n)
        assert_new_put_lands_at(store, n, end_of(results), 70)


def test_rebuilt_consume_queue_entries_equal_the_live_ones(small_config: StoreConfig) -> None:
    """Entries rebuilt from the log on recovery (record_codec's dispatch requests) are the
    ones the write path made, tag codes included: tags and keys differ on purpose."""
    with opened(small_config) as store:
        for i in range(140):
            props = {UNIQ_KEY: key_of(i), TAGS: f"tag{i % 5}", KEYS: f"key{i}"}
            store.put_message(Message(TOPIC, body_of(key_of(i)), props, queue_id=i % QUEUES))
        assert store.wait_dispatched(10)
    root = Path(small_config.store_dir) / "consumequeue"
    live = {p: p.read_bytes() for p in sorted(root.rglob("[0-9]" * 20))}
    for path, data in live.items():  # every entry lost: recovery rebuilds them all
        path.write_bytes(bytes(len(data)))
    mark_unclean(small_config)
    with recovered(small_config) as store:
        assert store.recovery.redispatched_messages == 140
        assert store.wait_dispatched(10)
    assert {p: p.read_bytes() for p in sorted(root.rglob("[0-9]" * 20))} == live


# -- idempotence -------------------------------------------------------------------------------


def test_recovery_is_idempotent(small_config: StoreConfig) -> None:
    n = 30
    results = write_store(small_config, n)
    end = end_of(results)
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
        with opened(small_config) as store:
            r = store.recovery
            assert r.unclean_shutdown is unclean
            assert (r.truncated_bytes, r.saved, r.consume_queue_entries_dropped) == (0, [], 0)
            assert r.stop_reason == "eof"
            assert r.index_truncated is False
            assert r.log_end == end
            assert_intact(store, results, n)
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
    with opened(_quiet(small_config)) as store:
        durable = _fill_past_a_roll(store)
        store.flush_logics()  # the periodic checkpoint, before the next periodic log flush
        cp = Checkpoint.load(Path(small_config.store_dir) / "checkpoint")
        assert cp is not None
        assert cp.phys_flushed_offset <= durable


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
    with opened(config) as store:
        durable = _fill_past_a_roll(store)
        store.flush_logics()  # periodic checkpoint: ConsumeQueues and index are fsynced
        crashed = tmp_path / "crashed"
        shutil.copytree(config.store_dir, crashed)  # what the page cache holds at the crash
    # Power loss: the log bytes written after the last log flush never reached the disk.
    log = crashed / "commitlog"
    seg0 = bytearray((log / segment_name(0)).read_bytes())
    seg0[durable:] = bytes(SEG - durable)
    (log / segment_name(0)).write_bytes(bytes(seg0))
    (log / segment_name(SEG)).write_bytes(bytes(SEG))

    config = dataclasses.replace(config, store_dir=crashed)
    with recovered(config) as store:
        assert store.recovery.unclean_shutdown is True
        assert store.wait_dispatched(10)
        msgs = read_all(store)
        junk = [m for m in msgs if m.topic != TOPIC or m.body != body_of(m.uniq_key or "")]
        assert not junk, f"{len(junk)} ConsumeQueue entries served lost log bytes as messages"
        assert all(m.phys_offset + m.total_size <= durable for m in msgs)
        assert store.commit_log.max_offset == durable
