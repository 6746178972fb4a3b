"""Expired-file cleanup (RocketMQ's CleanCommitLogService and CleanConsumeQueueService).

Log segments older than `file_reserved_hours` (by modification time, as RocketMQ) are
deleted at the `delete_when` hours, or at any hour once disk use passes
`disk_max_used_ratio`; past `disk_force_clean_ratio` the oldest segments go even if young;
past `disk_danger_ratio` writes are refused. The segment being written is never deleted.
ConsumeQueue and index files that only point below the log's new start follow.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from broker_runtime.common.clock import Clock
from broker_runtime.common.config import StoreConfig
from broker_runtime.store.mapped_file import MappedFile

if TYPE_CHECKING:
    from broker_runtime.store.message_store import MessageStore

DELETE_FILES_BATCH_MAX = 10  # deleteCommitLogFilesBatchMax


def disk_used_ratio(path: Path) -> float:
    usage = shutil.disk_usage(path)
    return usage.used / usage.total if usage.total else 0.0


@dataclass
class CleanupReport:
    reason: str | None  # None: nothing was due
    disk_ratio: float
    commitlog_deleted: list[str] = field(default_factory=list)
    consume_queue_files_deleted: int = 0
    index_files_deleted: int = 0


class CleanupPolicy:
    def __init__(
        self,
        config: StoreConfig,
        clock: Clock,
        disk_ratio: Callable[[Path], float] | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self._disk_ratio = disk_ratio or disk_used_ratio
        self._hours = {int(h) for h in config.delete_when.split(";") if h.strip()}
        self.disk_full = False

    def ratio(self) -> float:
        r = self._disk_ratio(Path(self.config.store_dir))
        self.disk_full = r > self.config.disk_danger_ratio
        return r

    def due(self, ratio: float) -> tuple[str | None, bool]:
        """(why cleanup is due or None, whether young files may go too)."""
        c = self.config
        if ratio > c.disk_force_clean_ratio:
            return "disk_force_clean_ratio", True
        if ratio > c.disk_max_used_ratio:
            return "disk_max_used_ratio", False
        if self.clock.local_hour() in self._hours:
            return "delete_when", False
        return None, False

    def run(self, store: MessageStore, force: bool = False) -> CleanupReport:
        ratio = self.ratio()
        reason, forcibly = self.due(ratio)
        if force:
            reason = reason or "manual"
        report = CleanupReport(reason, ratio)
        if reason is None:
            return report
        expired_before = self.clock.now_ms() - int(self.config.file_reserved_hours * 3_600_000)
        deleted: list[str] = []

        def expired(f: MappedFile) -> bool:
            if len(deleted) >= DELETE_FILES_BATCH_MAX:
                return False
            young = f.last_modified_ms() >= expired_before
            if young and not (forcibly and self.ratio() > self.config.disk_max_used_ratio):
                return False
            deleted.append(f.path.name)
            return True

        log = store.commit_log
        with log.lock:
            log.segments.delete_files(expired, keep_last=True)
        report.commitlog_deleted = deleted
        if deleted:
            min_offset = log.min_offset
            for cq in store.queues().values():
                report.consume_queue_files_deleted += cq.delete_expired(min_offset)
            if store.index is not None:
                report.index_files_deleted = store.index.delete_expired(min_offset)
        self.ratio()
        return report
