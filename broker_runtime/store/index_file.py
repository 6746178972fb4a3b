"""One RocketMQ IndexFile: a hash table of message keys to CommitLog offsets, in one mmap.

Byte layout (big-endian, as Java's ByteBuffer writes it), RocketMQ 4.x `IndexFile`/`IndexHeader`:

- header, 40 bytes: beginTimestamp i64, endTimestamp i64, beginPhyOffset i64, endPhyOffset i64,
  hashSlotCount i32 (number of puts, as RocketMQ counts it), indexCount i32 (next free entry;
  entry 0 is never used, so an empty file has 1);
- `hash_slot_num` slots of i32: the newest entry of the slot, 0 for none;
- `index_num` entries of 20 bytes: keyHash i32, phyOffset i64, timeDiff i32 (whole seconds since
  beginTimestamp), prevIndex i32 (the entry the slot held before this one).
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from broker_runtime.common.java_hash import java_string_hash
from broker_runtime.store.accel import native

HEADER_SIZE = 40
HASH_SLOT_SIZE = 4
INDEX_SIZE = 20
_HEADER = struct.Struct(">qqqqii")
_ENTRY = struct.Struct(">iqii")
_INT = struct.Struct(">i")
_INT_MAX = 0x7FFFFFFF
_ABS_INT_MIN = 0x80000000


def index_key_hash(key: str) -> int:
    """RocketMQ `indexKeyHashMethod`: |hashCode|, but 0 for Integer.MIN_VALUE (abs overflows)."""
    h = abs(java_string_hash(key))
    return 0 if h == _ABS_INT_MIN else h


def positive_hashes(hashes: Sequence[int]) -> list[int]:
    """`index_key_hash` for already computed Java hash codes."""
    return [0 if h == -_ABS_INT_MIN else (h if h >= 0 else -h) for h in hashes]


def _write_entries(
    mm: mmap.mmap, key_hashes: Sequence[int], phy_offsets: Sequence[int],
    timestamps: Sequence[int], start: int, stop: int, count: int, slots: int, entries_at: int,
    base: int,
) -> None:  # fmt: skip
    """Write entries [start, stop) as entries `count`... of the file and point their slots at them.

    `base` is the file's beginTimestamp the time differences count from.
    """
    read_int = _INT.unpack_from
    write_int = _INT.pack_into
    write_entry = _ENTRY.pack_into
    pos = entries_at + count * INDEX_SIZE
    for key_hash, phy, ts in zip(
        key_hashes[start:stop], phy_offsets[start:stop], timestamps[start:stop], strict=True
    ):
        slot_at = HEADER_SIZE + (key_hash % slots) * HASH_SLOT_SIZE
        prev = read_int(mm, slot_at)[0]
        if prev <= 0 or prev >= count:
            prev = 0
        diff = (ts - base) // 1000
        if diff < 0:
            diff = 0
        elif diff > _INT_MAX:
            diff = _INT_MAX
        write_entry(mm, pos, key_hash, phy, diff, prev)
        write_int(mm, slot_at, count)
        count += 1
        pos += INDEX_SIZE


write_entries = _write_entries if native is None else native.write_entries


def file_name_for(timestamp_ms: int) -> str:
    """RocketMQ `UtilAll.timeMillisToHumanString`: local time as yyyyMMddHHmmssSSS."""
    seconds = time.strftime("%Y%m%d%H%M%S", time.localtime(timestamp_ms // 1000))
    return f"{seconds}{timestamp_ms % 1000:03d}"


def file_size(hash_slot_num: int, index_num: int) -> int:
    """Size in bytes of an index file with these dimensions."""
    return HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE + index_num * INDEX_SIZE


class IndexFile:
    """One index file, mapped read-write; not thread safe (the IndexService locks)."""

    def __init__(self, path: Path, mm: mmap.mmap, hash_slot_num: int, index_num: int) -> None:
        """Use `create` or `open`."""
        self.path = path
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self._mm = mm
        self._entries_at = HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE
        begin_ts, end_ts, begin_phy, end_phy, puts, count = _HEADER.unpack_from(mm, 0)
        self.begin_timestamp: int = begin_ts
        self.end_timestamp: int = end_ts
        self.begin_phy_offset: int = begin_phy
        self.end_phy_offset: int = end_phy
        self.hash_slot_count: int = puts
        self.index_count: int = max(count, 1)  # RocketMQ leaves 0 on disk until the first put

    @classmethod
    def create(cls, path: str | os.PathLike[str], hash_slot_num: int, index_num: int) -> IndexFile:
        """Create a new, sparse, all-zero file; fails if `path` exists."""
        size = file_size(hash_slot_num, index_num)
        if hash_slot_num <= 0 or index_num <= 1 or size > _INT_MAX:
            # Java addresses the file with ints: a bigger file could not be read by RocketMQ.
            raise ValueError(f"bad index file dimensions: {hash_slot_num} slots, {index_num}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        return cls(Path(path), mm, hash_slot_num, index_num)

    @classmethod
    def open(cls, path: str | os.PathLike[str], hash_slot_num: int, index_num: int) -> IndexFile:
        """Map an existing file, which must have exactly these dimensions."""
        size = file_size(hash_slot_num, index_num)
        fd = os.open(path, os.O_RDWR)
        try:
            actual = os.fstat(fd).st_size
            if actual != size:
                raise ValueError(f"{path}: {actual} bytes, expected {size} for this configuration")
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        return cls(Path(path), mm, hash_slot_num, index_num)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def is_empty(self) -> bool:
        return self.index_count <= 1

    @property
    def is_full(self) -> bool:
        return self.index_count >= self.index_num

    def _write_header(self) -> None:
        _HEADER.pack_into(
            self._mm, 0, self.begin_timestamp, self.end_timestamp, self.begin_phy_offset,
            self.end_phy_offset, self.hash_slot_count, self.index_count,
        )  # fmt: skip

    def put_key(self, key: str, phy_offset: int, store_timestamp: int) -> bool:
        """Index one key (RocketMQ `putKey`); False if the file is full."""
        return self.put_many([index_key_hash(key)], [phy_offset], [store_timestamp], 0) == 1

    def put_many(
        self, key_hashes: Sequence[int], phy_offsets: Sequence[int], timestamps: Sequence[int],
        start: int,
    ) -> int:  # fmt: skip
        """Append entries from `start` on (key hashes already made positive) until the file is full.

        Returns the position after the last entry written. Entries and slots are written first and
        the header last, so a crash mid-batch leaves the header describing complete entries only
        (see `repair_slots` for the slots).
        """
        count = self.index_count
        stop = min(len(key_hashes), start + self.index_num - count)
        if stop <= start:
            return start
        if count <= 1:
            self.begin_phy_offset = phy_offsets[start]
            self.begin_timestamp = timestamps[start]
        # RocketMQ stores timeDiff 0 while beginTimestamp <= 0; a huge base clamps every diff to 0.
        base = self.begin_timestamp if self.begin_timestamp > 0 else 1 << 62
        write_entries(
            self._mm, key_hashes, phy_offsets, timestamps, start, stop, count, self.hash_slot_num,
            self._entries_at, base,
        )  # fmt: skip
        count += stop - start
        self.hash_slot_count += stop - start
        self.index_count = count
        self.end_phy_offset = phy_offsets[stop - 1]
        self.end_timestamp = timestamps[stop - 1]
        self._write_header()
        return stop

    def is_time_matched(self, begin_ms: int, end_ms: int) -> bool:
        """Whether [begin_ms, end_ms] overlaps the file's [beginTimestamp, endTimestamp]."""
        return begin_ms <= self.end_timestamp and end_ms >= self.begin_timestamp

    def select(
        self, key_hash: int, max_num: int, begin_ms: int, end_ms: int, out: list[int],
        seen: set[int],
    ) -> None:  # fmt: skip
        """Append to `out` (newest first, skipping offsets in `seen`) entries of the key's slot.

        An entry matches if its key hash does and its time, to the second RocketMQ stores, lies in
        [begin_ms, end_ms]. The walk stops at the first entry older than `begin_ms`, as RocketMQ's.
        """
        count = self.index_count
        if count <= 1 or len(out) >= max_num:
            return
        mm = self._mm
        read_entry = _ENTRY.unpack_from
        index = _INT.unpack_from(mm, HEADER_SIZE + (key_hash % self.hash_slot_num) * 4)[0]
        if index <= 0 or index >= count:
            return
        begin_ts = self.begin_timestamp
        while len(out) < max_num:
            entry_hash, phy, diff, prev = read_entry(mm, self._entries_at + index * INDEX_SIZE)
            if diff < 0:
                break
            stored_at = begin_ts + diff * 1000
            if entry_hash == key_hash and begin_ms <= stored_at <= end_ms and phy not in seen:
                seen.add(phy)
                out.append(phy)
            # Chains only point backwards; `prev >= index` would be a corrupt loop.
            if prev <= 0 or prev >= index or stored_at < begin_ms:
                break
            index = prev

    def tail_count(self, phy_offset: int) -> int:
        """How many of the newest entries point at `phy_offset`."""
        index = self.index_count - 1
        while index >= 1:
            phy = struct.unpack_from(">q", self._mm, self._entries_at + index * INDEX_SIZE + 4)[0]
            if phy != phy_offset:
                break
            index -= 1
        return self.index_count - 1 - index

    def repair_slots(self) -> int:
        """Re-point slots that a crash left ahead of indexCount; returns how many were fixed.

        Slots are written after their entries, so such a slot leads through complete (if
        uncommitted) entries whose prevIndex chain reaches the slot's committed value.
        """
        count = self.index_count
        slots = np.frombuffer(self._mm[HEADER_SIZE : self._entries_at], dtype=">i4")
        bad = np.flatnonzero((slots >= count) | (slots < 0)).tolist()
        for slot in bad:
            index = int(slots[slot])
            while count <= index < self.index_num:
                prev = _INT.unpack_from(self._mm, self._entries_at + index * INDEX_SIZE + 16)[0]
                index = prev if prev < index else 0
            _INT.pack_into(self._mm, HEADER_SIZE + slot * 4, index if 0 < index < count else 0)
        return len(bad)

    def flush(self) -> None:
        """msync the whole mapping (RocketMQ `IndexFile.flush`)."""
        self._mm.flush()

    def close(self) -> None:
        if not self._mm.closed:
            self._mm.close()

    def destroy(self) -> None:
        """Unmap and delete the file."""
        self.close()
        self.path.unlink(missing_ok=True)
