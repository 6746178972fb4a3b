"""MessageStore end to end on real files: ConsumeQueue and index rebuilt from the log, queries
by key and by message id."""

from __future__ import annotations

import dataclasses
import shutil
import struct
import threading
import time
from pathlib import Path

import pytest

from broker_runtime.common.clock import FakeClock
from broker_runtime.common.config import StoreConfig
from broker_runtime.common.message import Message, StoredMessage, offset_msg_id
from broker_runtime.common.topics import InvalidNameError
from broker_runtime.store import inspection, message_store
from broker_runtime.store.consume_queue import ConsumeQueue
from broker_runtime.store.message_store import GetResult, MessageStore
from tests.unit.broker_runtime.store_helpers import (
    BLANK_MAGIC,
    SEG,
    T0,
    all_messages,
    body_of,
    log_files,
    opened,
)

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
    report = inspection.verify(root)
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


# -- threads ------------------------------------------------------------------------------------


def test_a_queue_opened_by_a_pull_while_the_dispatcher_opens_it_is_one_queue(
    small_config: StoreConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker's pulls (event loop) and its dispatcher (own thread) both open ConsumeQueues.

    Two objects for one new queue made the later one start the queue's files over the
    earlier one's entry 0: the queue then began at offset 1 and its first message was never
    delivered. Opening a queue is made slow here so that the two openings overlap.
    """

    class SlowToOpen(ConsumeQueue):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            time.sleep(0.05)  # between reading the queue's directory and being registered

    monkeypatch.setattr(message_store, "ConsumeQueue", SlowToOpen)
    with opened(small_config) as store:
        opened_by_pull: list[ConsumeQueue] = []
        store.put_message(Message("Race", body_of(0, 100), {"UNIQ_KEY": "R0"}, queue_id=0))
        time.sleep(0.01)  # the dispatcher is opening the queue now
        pull = threading.Thread(
            target=lambda: opened_by_pull.append(store.consume_queue("Race", 0))
        )
        pull.start()
        pull.join()
        assert store.wait_dispatched()
        store.put_message(Message("Race", body_of(1, 100), {"UNIQ_KEY": "R1"}, queue_id=0))
        assert store.wait_dispatched()
        assert opened_by_pull == [store.consume_queue("Race", 0)]
        got = store.get_messages("Race", 0, 0, 10)
        assert (got.min_offset, got.max_offset) == (0, 2)
        assert [m.uniq_key for m in got.messages] == ["R0", "R1"]
