"""Helpers for the recovery tests (test_recovery_*.py): a store of numbered messages in one topic,
raw reads and writes of its log files, and the checks run after recovery."""

from __future__ import annotations

from pathlib import Path

from broker_runtime.common.config import StoreConfig
from broker_runtime.common.message import TAGS, UNIQ_KEY, Message, StoredMessage
from broker_runtime.store.commit_log import PutResult
from broker_runtime.store.mapped_file import segment_name
from broker_runtime.store.message_store import MessageStore
from tests.unit.broker_runtime.store_helpers import opened

TOPIC = "RecoveryTopic"
QUEUES = 2


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


def write_store(config: StoreConfig, n: int) -> list[PutResult]:
    """A store holding messages 0..n-1, stopped cleanly."""
    with opened(config) as store:
        results = [store.put_message(msg(i)) for i in range(n)]
        assert store.wait_dispatched(10)
    return results


def end_of(results: list[PutResult]) -> int:
    """The log offset just past the last message put."""
    return results[-1].phys_offset + results[-1].size


# -- the files on disk ------------------------------------------------------------------------


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


def flip_bits(config: StoreConfig, phys: int, mask: int) -> None:
    """Damage the log byte at `phys` by XOR-ing it with `mask`."""
    write_log(config, phys, bytes([read_log(config, phys, 1)[0] ^ mask]))


def mark_unclean(config: StoreConfig) -> None:
    (Path(config.store_dir) / "abort").touch()


def recovery_dir(config: StoreConfig) -> Path:
    return Path(config.store_dir) / "recovery"


def saved_as(config: StoreConfig, phys: int, kind: str) -> Path:
    """Where recovery moves what it cuts at log offset `phys`: kind "torn" or "segment"."""
    return recovery_dir(config) / f"{segment_name(phys)}.{kind}"


# -- reads and checks -------------------------------------------------------------------------


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


def assert_new_put_lands_at(store: MessageStore, i: int, phys: int, queue_offset: int) -> None:
    r = store.put_message(msg(i))
    assert (r.phys_offset, r.queue_offset) == (phys, queue_offset)
    assert store.wait_dispatched(10)
    assert [m.phys_offset for m in store.query_by_key(TOPIC, key_of(i))] == [phys]
    got = store.get_messages(TOPIC, i % QUEUES, queue_offset, 5).messages
    assert [(m.uniq_key, m.body) for m in got] == [(key_of(i), body_of(key_of(i)))]
