"""MessageStore end to end on real files: names and sizes refused, SYNC_FLUSH group commit."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import pytest

from broker_runtime.common.config import FlushMode, StoreConfig
from broker_runtime.common.message import Message
from broker_runtime.common.topics import InvalidNameError
from broker_runtime.store import inspection
from broker_runtime.store.message_store import MessageStore
from broker_runtime.store.record_codec import MessageRejected
from tests.unit.broker_runtime.store_helpers import SEG, all_messages, body_of, log_files

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
    assert inspection.verify(cfg.store_dir).consistent
