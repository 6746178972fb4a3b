"""Expired-file cleanup with a fake clock and an injected disk ratio: when log segments go,
what follows them (ConsumeQueue, index) and when writes are refused."""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_runtime.common.clock import FakeClock
from broker_runtime.common.config import StoreConfig
from broker_runtime.common.message import Message
from broker_runtime.store import inspection
from broker_runtime.store.commit_log import PutResult
from broker_runtime.store.message_store import MessageStore, StoreUnavailable

SEG = 64 * 1024
T0 = 1_700_000_000_000  # FakeClock's "now"
HOUR_MS = 3_600_000


class Disk:
    """The injected disk-usage ratio; records the paths it was asked about."""

    def __init__(self, ratio: float = 0.1) -> None:
        self.ratio = ratio
        self.paths: list[Path] = []

    def __call__(self, path: Path) -> float:
        self.paths.append(path)
        return self.ratio


@pytest.fixture
def cfg(small_config: StoreConfig) -> StoreConfig:
    # The periodic cleanup must not run behind the tests' back.
    return dataclasses.replace(
        small_config, cleanup_interval_ms=10**9, file_reserved_hours=72, delete_when="04;16"
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start_ms=T0, hour=12)


@pytest.fixture
def disk() -> Disk:
    return Disk()


@pytest.fixture
def store(cfg: StoreConfig, clock: FakeClock, disk: Disk) -> Iterator[MessageStore]:
    s = MessageStore(cfg, clock=clock, disk_ratio=disk)
    try:
        yield s
    finally:
        s.shutdown()


def body_of(i: int) -> bytes:
    return f"m{i:05d}|".encode().ljust(900, b".")


def fill(
    store: MessageStore, segments: int, *, topics: tuple[str, ...] = ("A", "B")
) -> list[tuple[Message, PutResult]]:
    """Write until the log has `segments` files; messages alternate topics and queues."""
    results = []
    i = 0
    while len(store.commit_log.segments.files) < segments:
        topic = topics[i % len(topics)]
        props = {"UNIQ_KEY": f"U{i}", "KEYS": f"k{i} j{i} h{i}"}
        m = Message(topic, body_of(i), props, queue_id=(i // 2) % 2)
        results.append((m, store.put_message(m)))
        i += 1
    store.wait_dispatched()
    return results


def log_names(cfg: StoreConfig) -> list[str]:
    return sorted(os.listdir(cfg.store_dir / "commitlog"))


def age(cfg: StoreConfig, names: list[str], hours: float) -> None:
    """Make log files look `hours` old as seen from the fake clock."""
    t = (T0 - hours * HOUR_MS) / 1000
    for name in names:
        os.utime(cfg.store_dir / "commitlog" / name, (t, t))


def seg(i: int) -> str:
    return f"{i * SEG:020d}"


def test_expired_files_go_only_at_a_delete_when_hour(
    store: MessageStore, cfg: StoreConfig, clock: FakeClock, disk: Disk
) -> None:
    fill(store, 5)
    age(cfg, [seg(0), seg(1)], 73)  # expired
    age(cfg, [seg(2)], 71)  # not yet
    for hour in (0, 3, 5, 12, 15, 17, 23):
        clock.set_hour(hour)
        report = store.run_cleanup()
        assert report.reason is None and report.commitlog_deleted == []
        assert log_names(cfg) == [seg(i) for i in range(5)]
    clock.set_hour(4)
    report = store.run_cleanup()
    assert report.reason == "delete_when"
    assert report.disk_ratio == disk.ratio
    assert report.commitlog_deleted == [seg(0), seg(1)]
    assert log_names(cfg) == [seg(2), seg(3), seg(4)]
    assert store.commit_log.min_offset == 2 * SEG
    # The young file expires as the clock moves on; the other listed hour works too.
    clock.advance(2 * HOUR_MS)
    clock.set_hour(16)
    assert store.run_cleanup().commitlog_deleted == [seg(2)]
    assert log_names(cfg) == [seg(3), seg(4)]
    assert disk.paths and all(p == cfg.store_dir for p in disk.paths)


def test_oldest_young_file_stops_deletion(
    store: MessageStore, cfg: StoreConfig, clock: FakeClock
) -> None:
    fill(store, 4)
    age(cfg, [seg(1), seg(2)], 100)  # seg 0 is young: files go oldest first only
    clock.set_hour(4)
    assert store.run_cleanup().commitlog_deleted == []
    assert log_names(cfg) == [seg(i) for i in range(4)]


def test_manual_force_runs_outside_the_hours(store: MessageStore, cfg: StoreConfig) -> None:
    fill(store, 3)
    age(cfg, [seg(0)], 80)
    report = store.run_cleanup(force=True)
    assert report.reason == "manual"
    assert report.commitlog_deleted == [seg(0)]


def test_disk_above_max_used_ratio_deletes_expired_files_at_any_hour(
    store: MessageStore, cfg: StoreConfig, disk: Disk
) -> None:
    fill(store, 4)
    age(cfg, [seg(0)], 80)
    disk.ratio = 0.75  # not above the ratio: nothing at hour 12
    assert store.run_cleanup().reason is None
    disk.ratio = 0.80
    report = store.run_cleanup()
    assert report.reason == "disk_max_used_ratio"
    assert report.commitlog_deleted == [seg(0)]  # young files stay
    assert log_names(cfg) == [seg(1), seg(2), seg(3)]


def test_disk_above_force_clean_ratio_deletes_young_files_too(
    store: MessageStore, cfg: StoreConfig, disk: Disk
) -> None:
    results = fill(store, 4)
    age(cfg, [seg(0)], 80)
    disk.ratio = 0.87
    report = store.run_cleanup()
    assert report.reason == "disk_force_clean_ratio"
    assert report.commitlog_deleted == [seg(0), seg(1), seg(2)]
    assert log_names(cfg) == [seg(3)]  # the file being written stays
    assert not store.cleanup.disk_full  # 0.87 is below the danger ratio
    # Writing goes on in the surviving file.
    r = store.put_message(Message("A", b"after"))
    assert r.phys_offset == results[-1][1].phys_offset + results[-1][1].size
    assert log_names(cfg) == [seg(3)]


def test_current_segment_is_never_deleted(
    store: MessageStore, cfg: StoreConfig, disk: Disk
) -> None:
    results = fill(store, 3)
    age(cfg, log_names(cfg), 1000)  # every file, the current one included, is ancient
    disk.ratio = 0.89
    report = store.run_cleanup()
    assert report.commitlog_deleted == [seg(0), seg(1)]
    assert log_names(cfg) == [seg(2)]
    report = store.run_cleanup()
    assert report.commitlog_deleted == []
    assert log_names(cfg) == [seg(2)]
    store.wait_dispatched()
    in_last = [(m, r) for m, r in results if r.phys_offset >= 2 * SEG]
    assert in_last
    for m, r in in_last:  # what the surviving file holds is still readable
        got = store.get_messages(m.topic, m.queue_id, r.queue_offset, 1).messages
        assert [x.body for x in got] == [m.body]
        assert store.message_at(r.phys_offset) == got[0]
    assert store.message_at(results[0][1].phys_offset) is None


def test_only_a_batch_of_ten_files_per_run(
    store: MessageStore, cfg: StoreConfig, clock: FakeClock
) -> None:
    fill(store, 13)
    age(cfg, log_names(cfg)[:-1], 100)
    clock.set_hour(4)
    assert len(store.run_cleanup().commitlog_deleted) == 10
    assert store.run_cleanup().commitlog_deleted == [seg(10), seg(11)]
    assert log_names(cfg) == [seg(12)]


QUEUES = [(t, q) for t in ("A", "B") for q in (0, 1)]


def survivors(
    results: list[tuple[Message, PutResult]], log_min: int
) -> dict[tuple[str, int], list[tuple[Message, PutResult]]]:
    out: dict[tuple[str, int], list[tuple[Message, PutResult]]] = {k: [] for k in QUEUES}
    for m, r in results:
        if r.phys_offset >= log_min:
            out[(m.topic, m.queue_id)].append((m, r))
    return out


def assert_queues_start_at_survivors(
    store: MessageStore, results: list[tuple[Message, PutResult]], log_min: int
) -> None:
    for (t, q), kept in survivors(results, log_min).items():
        assert kept
        first_qo = kept[0][1].queue_offset
        assert first_qo > 0  # something of every queue was deleted
        assert store.min_offset(t, q) == first_qo
        res = store.get_messages(t, q, 0, 10_000)  # from 0: starts at the first survivor
        assert [m.body for m in res.messages] == [m.body for m, _ in kept]
        assert [m.queue_offset for m in res.messages] == [r.queue_offset for _, r in kept]
        assert res.min_offset == first_qo
        assert res.next_offset == res.max_offset == kept[-1][1].queue_offset + 1
        assert [m.body for m in store.get_messages(t, q, 0, 1).messages] == [kept[0][0].body]


def test_consume_queue_min_offsets_move_past_deleted_data(
    store: MessageStore, cfg: StoreConfig, clock: FakeClock
) -> None:
    results = fill(store, 4)
    age(cfg, [seg(0)], 100)
    clock.set_hour(4)
    report = store.run_cleanup()
    assert report.commitlog_deleted == [seg(0)]
    log_min = store.commit_log.min_offset
    assert log_min == SEG
    assert report.consume_queue_files_deleted == 0  # ~16 entries a queue: inside the first file
    assert_queues_start_at_survivors(store, results, log_min)
    assert inspection.verify(cfg.store_dir).consistent
    # Deleted messages are gone from the id and key lookups too.
    gone_m, gone = results[0]
    assert store.message_at(gone.phys_offset) is None
    assert store.query_by_key(gone_m.topic, "U0") == []
    for m, r in results[-10:]:
        found = store.query_by_key(m.topic, m.properties["UNIQ_KEY"])
        assert [x.phys_offset for x in found] == [r.phys_offset]


def test_consume_queue_min_offsets_move_past_deleted_cq_files(
    store: MessageStore, cfg: StoreConfig, clock: FakeClock
) -> None:
    results = fill(store, 7)
    age(cfg, [seg(i) for i in range(5)], 100)
    clock.set_hour(4)
    report = store.run_cleanup()
    assert len(report.commitlog_deleted) == 5
    log_min = store.commit_log.min_offset
    # ~300 messages deleted over 4 queues: each queue's first CQ file (64 entries) is expired.
    assert report.consume_queue_files_deleted == 4
    for t, q in QUEUES:
        assert seg(0) not in os.listdir(cfg.store_dir / "consumequeue" / t / str(q))
    assert_queues_start_at_survivors(store, results, log_min)


def test_cleanup_state_survives_a_restart_and_a_rebuild(
    cfg: StoreConfig, clock: FakeClock, disk: Disk
) -> None:
    with MessageStore(cfg, clock=clock, disk_ratio=disk) as s:
        results = fill(s, 7)
        age(cfg, [seg(i) for i in range(5)], 100)
        clock.set_hour(4)
        assert len(s.run_cleanup().commitlog_deleted) == 5
        log_min = s.commit_log.min_offset
    with MessageStore(cfg, clock=clock, disk_ratio=disk) as s:
        assert s.commit_log.min_offset == log_min
        assert_queues_start_at_survivors(s, results, log_min)
    shutil.rmtree(cfg.store_dir / "consumequeue")
    with MessageStore(cfg, clock=clock, disk_ratio=disk) as s:
        assert_queues_start_at_survivors(s, results, log_min)
        for (t, q), kept in survivors(results, log_min).items():
            nxt = kept[-1][1].queue_offset + 1
            assert s.put_message(Message(t, b"new", queue_id=q)).queue_offset == nxt
    assert inspection.verify(cfg.store_dir).consistent


def test_index_files_covering_only_deleted_data_are_removed(
    store: MessageStore, cfg: StoreConfig, clock: FakeClock
) -> None:
    results = fill(store, 6)  # 4 index entries a message, 511 a file: several index files
    index_dir = cfg.store_dir / "index"
    assert store.index is not None
    files_before = store.index.files
    assert len(files_before) >= 3
    age(cfg, [seg(0), seg(1), seg(2), seg(3)], 100)
    clock.set_hour(4)
    report = store.run_cleanup()
    log_min = store.commit_log.min_offset
    assert log_min == 4 * SEG
    gone = [f for f in files_before if f.end_phy_offset < log_min]
    assert gone, "the test needs an index file wholly below the new log start"
    assert report.index_files_deleted == len(gone)
    names = sorted(os.listdir(index_dir))
    assert names == sorted(f.name for f in files_before if f.end_phy_offset >= log_min)
    remaining = store.index.files
    assert all(f.end_phy_offset >= log_min for f in remaining)
    # Every surviving message can still be found by key.
    for m, r in results[-20:]:
        key = m.properties["KEYS"].split()[1]
        assert [x.phys_offset for x in store.query_by_key(m.topic, key)] == [r.phys_offset]
    assert store.query_by_key(results[0][0].topic, "j0") == []


def test_disk_above_danger_ratio_refuses_writes(
    store: MessageStore, cfg: StoreConfig, disk: Disk
) -> None:
    store.put_message(Message("A", b"before"))
    disk.ratio = 0.90  # the danger ratio itself is still writable
    store.run_cleanup()
    store.put_message(Message("A", b"at-ratio"))
    end = store.commit_log.max_offset
    disk.ratio = 0.95
    store.run_cleanup()
    assert store.cleanup.disk_full
    with pytest.raises(StoreUnavailable):
        store.put_message(Message("A", b"refused"))
    with pytest.raises(StoreUnavailable):
        store.put_messages([Message("A", b"refused")])
    assert store.commit_log.max_offset == end
    disk.ratio = 0.5
    store.run_cleanup()
    assert not store.cleanup.disk_full
    r = store.put_message(Message("A", b"again"))
    assert r.phys_offset == end and r.queue_offset == 2
    store.wait_dispatched()
    assert [m.body for m in store.get_messages("A", 0, 0, 10).messages] == [
        b"before",
        b"at-ratio",
        b"again",
    ]


def test_expired_consume_queue_file_is_deleted_after_the_queue_rolls(
    store: MessageStore, cfg: StoreConfig, clock: FakeClock
) -> None:
    # Queue A/0 gets exactly one full CQ file (64 entries), then only B is written.
    store.put_messages([Message("A", body_of(i)) for i in range(64)])
    while len(store.commit_log.segments.files) < 4:
        store.put_message(Message("B", body_of(0)))
    store.wait_dispatched()
    qdir = cfg.store_dir / "consumequeue" / "A" / "0"
    clock.set_hour(4)
    age(cfg, log_names(cfg)[:-1], 100)
    store.run_cleanup()
    assert store.min_offset("A", 0) == 64  # everything of A expired; its only file stays
    assert sorted(os.listdir(qdir)) == [f"{0:020d}"]
    # A rolls into a second CQ file, then that part of the log expires as well.
    store.put_messages([Message("A", body_of(i)) for i in range(5)])
    while len(store.commit_log.segments.files) < 3:
        store.put_message(Message("B", body_of(0)))
    store.wait_dispatched()
    age(cfg, log_names(cfg)[:-1], 100)
    assert store.run_cleanup().commitlog_deleted
    assert store.min_offset("A", 0) == 69
    assert sorted(os.listdir(qdir)) == [f"{64 * 20:020d}"]  # the expired first file is gone
