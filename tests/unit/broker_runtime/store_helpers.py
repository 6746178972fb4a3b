"""Helpers shared by the MessageStore tests (test_store_*.py, test_recovery_*.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from broker_runtime.common.config import StoreConfig
from broker_runtime.common.message import StoredMessage
from broker_runtime.store import inspection
from broker_runtime.store.message_store import MessageStore

SEG = 64 * 1024  # small_config's segment size
T0 = 1_700_000_000_000
BLANK_MAGIC = bytes.fromhex("CBD43194")
MESSAGE_MAGIC = bytes.fromhex("DAA320A7")


# -- opening and closing a store --------------------------------------------------------------


def open_store(config: StoreConfig) -> MessageStore:
    return MessageStore(config, disk_ratio=lambda _path: 0.0)


@contextmanager
def opened(config: StoreConfig) -> Iterator[MessageStore]:
    """The store opened (recovery runs), shut down when the block ends, even on failure."""
    store = open_store(config)
    try:
        yield store
    finally:
        store.shutdown()


@contextmanager
def recovered(config: StoreConfig) -> Iterator[MessageStore]:
    """As `opened`; once the block has passed and the store is shut down, it verifies consistent."""
    with opened(config) as store:
        yield store
    assert_consistent(config)


def assert_consistent(config: StoreConfig) -> inspection.VerifyReport:
    report = inspection.verify(Path(config.store_dir))
    assert report.consistent, report.as_dict()
    return report


# -- data and reads ---------------------------------------------------------------------------


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
