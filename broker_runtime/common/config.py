"""Frozen configuration of the store (RocketMQ's MessageStoreConfig, the parts we use)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path


class FlushMode(StrEnum):
    SYNC = "sync"  # SYNC_FLUSH: a put returns after fdatasync (group commit)
    ASYNC = "async"  # ASYNC_FLUSH: a background flush every flush_interval_ms


@dataclass(frozen=True)
class StoreConfig:
    store_dir: Path
    segment_size: int = 1 << 30  # mappedFileSizeCommitLog
    cq_entries_per_file: int = 300_000  # mappedFileSizeConsumeQueue / 20
    index_hash_slots: int = 5_000_000
    index_max_entries: int = 20_000_000
    build_index: bool = True
    flush: FlushMode = FlushMode.ASYNC
    flush_interval_ms: int = 500  # flushIntervalCommitLog
    cq_flush_interval_ms: int = 1000  # flushIntervalConsumeQueue (and the checkpoint)
    max_message_size: int = 4 * 1024 * 1024
    store_host: tuple[str, int] = ("127.0.0.1", 10911)
    # Expired-file cleanup (CleanCommitLogService).
    file_reserved_hours: float = 72.0
    delete_when: str = "04"  # hours of day, ";"-separated
    cleanup_interval_ms: int = 10_000
    disk_max_used_ratio: float = 0.75  # past this, delete expired files at any hour
    disk_force_clean_ratio: float = 0.85  # past this, delete the oldest files even if not expired
    disk_danger_ratio: float = 0.90  # past this, refuse writes

    def __post_init__(self) -> None:
        if self.segment_size < 4096:
            raise ValueError(f"segment_size {self.segment_size} is below 4096 bytes")
        if self.max_message_size > self.segment_size - 8:  # a unit must fit an empty segment
            object.__setattr__(self, "max_message_size", self.segment_size - 8)
        if not 0 < self.disk_max_used_ratio <= self.disk_force_clean_ratio <= 1:
            raise ValueError("disk ratios must satisfy 0 < max_used <= force_clean <= 1")
