"""The broker's message-key index: the IndexFiles of `{store}/index/`, as RocketMQ's IndexService.

Each dispatched message is indexed under `topic#UNIQ_KEY` and `topic#k` for each space-separated
key of its KEYS property. Files are created when the first key needs one, named after that
message's store time, and rolled when full.

Recovery contract: everything at or below `rebuild_from_offset()` is indexed; the caller
re-dispatches the CommitLog from that offset. `build` skips messages below the newest file's
endPhyOffset, and for the message exactly at it, the keys already present, so re-dispatching is
idempotent (no duplicate entries, none missing even if that message's keys straddle two files).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from broker_runtime.common.java_hash import java_hash_many
from broker_runtime.store.accel import native
from broker_runtime.store.index_file import (
    IndexFile,
    file_name_for,
    index_key_hash,
    positive_hashes,
)

KEY_SEPARATOR = " "  # RocketMQ MessageConst.KEY_SEPARATOR
# yyyyMMddHHmmssSSS, plus our `_NNNNNN` suffix when that name is taken or would sort too early.
_NAME = re.compile(r"\d{17}(_\d{6})?")


def _index_keys(
    entries: Sequence[tuple[str, int, int, str | None, str | None]],
    end: int,
    tail_count: Callable[[int], int],
) -> tuple[Sequence[int], Sequence[int], Sequence[int]]:
    """Key hashes (made positive), log offsets and store times of the keys `entries` index.

    Entries below `end` (the newest file's endPhyOffset) are skipped; of the one at `end`, the
    first `tail_count(end)` keys, which that file already holds. (The C kernel returns the
    three columns as array('q'), which `write_entries` reads without conversion.)
    """
    keys: list[str] = []
    phys: list[int] = []
    times: list[int] = []
    add = keys.append
    for topic, phy, ts, uniq, msg_keys in entries:
        if phy < end:
            continue
        first = len(keys)
        prefix = topic + "#"
        if uniq is not None:
            add(prefix + uniq)
        if msg_keys:
            for key in msg_keys.split(KEY_SEPARATOR):
                if key:
                    add(prefix + key)
        if phy == end:
            del keys[first : first + tail_count(end)]
        n = len(keys) - first
        if n:
            phys += [phy] * n
            times += [ts] * n
    return positive_hashes(java_hash_many(keys)), phys, times


index_keys = _index_keys if native is None else native.index_keys


class IndexService:
    """Thread safe: one lock serialises building, queries and file maintenance."""

    def __init__(
        self, store_dir: str | os.PathLike[str], *, hash_slot_num: int = 5_000_000,
        index_num: int = 20_000_000,
    ) -> None:  # fmt: skip
        """Open (creating if needed) `{store_dir}/index` and load its files in name order.

        Empty newest files (a crash right after creating one) are deleted, and the newest file's
        slots are repaired after a crash mid-batch (`IndexFile.repair_slots`).
        """
        self._dir = Path(store_dir) / "index"
        self._dir.mkdir(parents=True, exist_ok=True)
        self._slots = hash_slot_num
        self._num = index_num
        self._lock = threading.Lock()
        self._files: list[IndexFile] = []
        self._dirty: set[IndexFile] = set()
        self._dir_dirty = False
        self._closed = False
        for path in sorted(p for p in self._dir.iterdir() if _NAME.fullmatch(p.name)):
            self._files.append(IndexFile.open(path, hash_slot_num, index_num))
        while self._files and self._files[-1].is_empty:
            self._files.pop().destroy()
            self._dir_dirty = True
        if self._files:
            self._files[-1].repair_slots()

    @property
    def files(self) -> list[IndexFile]:
        """The loaded files, oldest first (a copy)."""
        with self._lock:
            return list(self._files)

    def build(self, entries: Sequence[tuple[str, int, int, str | None, str | None]]) -> None:
        """Index a batch of (topic, phys_offset, store_timestamp_ms, uniq_key, keys), phys order.

        The caller leaves out what RocketMQ does not index (rolled-back transactional messages).
        """
        with self._lock:
            end = self._files[-1].end_phy_offset if self._files else -1
            hashes, phys, times = index_keys(entries, end, self._tail_count)
            if hashes:
                self._put(hashes, phys, times)

    def _tail_count(self, phy_offset: int) -> int:
        # Entries for the message at `phy_offset` already written, newest file backwards.
        total = 0
        for f in reversed(self._files):
            n = f.tail_count(phy_offset)
            total += n
            if n < f.index_count - 1:
                break
        return total

    def _put(self, hashes: Sequence[int], phys: Sequence[int], times: Sequence[int]) -> None:
        start = 0
        while start < len(hashes):
            if not self._files or self._files[-1].is_full:
                self._files.append(self._create(times[start]))
            f = self._files[-1]
            start = f.put_many(hashes, phys, times, start)
            self._dirty.add(f)

    def _create(self, timestamp_ms: int) -> IndexFile:
        # RocketMQ names the file after the current time and would reopen (and overwrite) a file
        # of the same name. Names must also sort in creation order (load sorts them, and a clock
        # or store timestamps can go backwards), so a name that does not sort after the newest
        # file's becomes that name's stem plus a 6-digit counter.
        if self._closed:
            raise RuntimeError("IndexService is closed")
        name = file_name_for(timestamp_ms)
        if self._files and name <= self._files[-1].name:
            name = _next_name(self._files[-1].name)
        while True:
            try:
                f = IndexFile.create(self._dir / name, self._slots, self._num)
            except FileExistsError:  # someone else's file: do not touch it
                name = _next_name(name)
                continue
            self._dir_dirty = True
            return f

    def query(self, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int) -> list[int]:
        """Phys offsets of messages indexed under `topic#key` stored in [begin_ms, end_ms].

        Newest first, distinct, at most `max_num`. Matches are by key hash and by time to the
        second (RocketMQ's precision), so the caller must check the real messages' keys.
        """
        if max_num <= 0:
            return []
        key_hash = index_key_hash(f"{topic}#{key}")
        out: list[int] = []
        seen: set[int] = set()
        with self._lock:
            for f in reversed(self._files):
                if f.is_time_matched(begin_ms, end_ms):
                    f.select(key_hash, max_num, begin_ms, end_ms, out, seen)
                if f.begin_timestamp < begin_ms or len(out) >= max_num:
                    break
        return out

    def max_indexed_phys_offset(self) -> int:
        """endPhyOffset of the newest file: CommitLog offset of the last indexed message, or 0."""
        with self._lock:
            return self._files[-1].end_phy_offset if self._files else 0

    def rebuild_from_offset(self) -> int:
        """Where the caller must re-dispatch the CommitLog from (`max_indexed_phys_offset`)."""
        return self.max_indexed_phys_offset()

    def flush(self) -> None:
        """msync the files written since the last flush, and fsync the directory if it changed."""
        with self._lock:
            for f in self._dirty:
                f.flush()
            self._dirty.clear()
            if self._dir_dirty:
                fd = os.open(self._dir, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                self._dir_dirty = False

    def delete_expired(self, min_phys_offset: int) -> int:
        """Delete the oldest files whose endPhyOffset < `min_phys_offset`, never the newest one."""
        with self._lock:
            deleted = 0
            while len(self._files) > 1 and self._files[0].end_phy_offset < min_phys_offset:
                f = self._files.pop(0)
                self._dirty.discard(f)
                f.destroy()
                deleted += 1
            self._dir_dirty = self._dir_dirty or deleted > 0
            return deleted

    def truncate_from(self, phys_offset: int) -> None:
        """Forget everything indexed at or after `phys_offset` (the CommitLog was cut there).

        Whole files go: every file with an entry at or after the cut (endPhyOffset >= cut). The
        file straddling the cut is deleted rather than rewound because its newest entries may be
        torn after a power loss; `rebuild_from_offset()` then says where to re-dispatch from.
        """
        with self._lock:
            while self._files and self._files[-1].end_phy_offset >= phys_offset:
                f = self._files.pop()
                self._dirty.discard(f)
                f.destroy()
                self._dir_dirty = True

    def close(self) -> None:
        """Flush and unmap every file; the service is unusable afterwards."""
        self.flush()
        with self._lock:
            for f in self._files:
                f.close()
            self._files.clear()
            self._closed = True


def _next_name(name: str) -> str:
    counter = int(name[18:]) + 1 if len(name) > 17 else 1
    return f"{name[:17]}_{counter:06d}"
