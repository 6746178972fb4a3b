"""One topic/queue's ConsumeQueue: fixed 20-byte entries (log offset i64, size i32, tag code i64).

Files live at `consumequeue/{topic}/{queueId}/{20-digit byte offset}`; entry n sits at byte
n * 20 of the queue, so a queue offset is found by arithmetic, as in RocketMQ.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from broker_runtime.common.constants import CQ_BLANK_SIZE
from broker_runtime.store.accel import native
from broker_runtime.store.mapped_file import MappedFile
from broker_runtime.store.record_codec import DispatchRequest
from broker_runtime.store.segment_queue import SegmentQueue

ENTRY = struct.Struct(">qiq")
ENTRY_SIZE = ENTRY.size  # 20
DEFAULT_ENTRIES_PER_FILE = 300_000
# RocketMQ's fillPreBlank entry: marks queue offsets that have no message.
BLANK_ENTRY = ENTRY.pack(0, CQ_BLANK_SIZE, 0)


def _pack_entries(
    requests: Sequence[DispatchRequest], expected: int, max_phys_end: int
) -> tuple[bytearray, int, int, int, int]:
    """The entries of `requests` as appended to a queue whose next offset is `expected`.

    Skips requests at or below `max_phys_end` or `expected`, fills gaps with blank entries.
    Returns (bytes, next offset, new max_phys_end, entries added, blank entries added).
    """
    buf = bytearray()
    added = blanks = 0
    for _, _, queue_offset, phys, size, _, tags, _, _ in requests:  # unpacking is the fast way
        if phys + size <= max_phys_end or queue_offset < expected:
            continue
        if queue_offset > expected:
            gap = queue_offset - expected
            buf += BLANK_ENTRY * gap
            blanks += gap
            expected = queue_offset
        buf += ENTRY.pack(phys, size, tags)
        expected += 1
        max_phys_end = phys + size
        added += 1
    return buf, expected, max_phys_end, added, blanks


pack_entries = _pack_entries if native is None else native.pack_entries


class CqEntry(NamedTuple):
    queue_offset: int
    phys_offset: int
    size: int
    tags_code: int

    @property
    def blank(self) -> bool:
        """A filler entry: its queue offset holds no message."""
        return self.size == CQ_BLANK_SIZE


class ConsumeQueue:
    def __init__(self, root: Path, topic: str, queue_id: int, entries_per_file: int) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.segments = SegmentQueue(root / topic / str(queue_id), entries_per_file * ENTRY_SIZE)
        self.min_queue_offset = 0
        self.max_phys_end = 0  # end of the last message this queue points at
        self.blank_entries = 0
        self._recover()

    def _recover(self) -> None:
        """Find the last real entry: zeroes past it were never written."""
        files = self.segments.files
        while files:
            last = files[-1]
            end = self._last_entry_end(last.view)
            if end == 0 and len(files) > 1:
                files.pop().destroy()  # an empty trailing file rolled before a crash
                continue
            last.wrote_position = last.flushed_position = end
            break
        self._refresh_tail()
        self.min_queue_offset = self.segments.min_offset // ENTRY_SIZE

    @staticmethod
    def _last_entry_end(view: memoryview) -> int:
        lo, hi = 0, len(view) // ENTRY_SIZE  # entries are written front to back: bisect
        while lo < hi:
            mid = (lo + hi) // 2
            if ENTRY.unpack_from(view, mid * ENTRY_SIZE)[1] != 0:
                lo = mid + 1
            else:
                hi = mid
        return lo * ENTRY_SIZE

    def _refresh_tail(self) -> None:
        self.max_phys_end = 0
        n = self.max_offset
        for qo in range(n - 1, max(self.min_queue_offset, n - 64) - 1, -1):
            e = self.get(qo)
            if e is not None and not e.blank:
                self.max_phys_end = e.phys_offset + e.size
                break

    @property
    def max_offset(self) -> int:
        """The next queue offset to be written (RocketMQ's getMaxOffsetInQueue)."""
        return self.segments.max_offset // ENTRY_SIZE

    def put(self, requests: Sequence[DispatchRequest]) -> int:
        """Append the entries of `requests` (this queue's, in log order); returns how many.

        Requests this queue already has (a re-dispatch after recovery) are skipped; a gap
        is filled with blank entries and counted.
        """
        if not requests:
            return 0
        expected = self.max_offset
        if not self.segments.files:  # a new queue: its files start where its first entry is
            expected = requests[0].queue_offset
            self._start_at(expected)
        buf, _, self.max_phys_end, added, blanks = pack_entries(
            requests, expected, self.max_phys_end
        )
        self.blank_entries += blanks
        self._append(buf)
        return added

    def _start_at(self, queue_offset: int) -> None:
        seg = self.segments
        start = queue_offset * ENTRY_SIZE
        f = seg.last_file(start)
        fill = start - f.file_from_offset
        if fill:
            f.append(BLANK_ENTRY * (fill // ENTRY_SIZE))
        self.min_queue_offset = queue_offset

    def _append(self, buf: bytearray) -> None:
        view = memoryview(buf)
        while view:
            f = self.segments.last_file()
            n = min(len(view), f.remaining())
            f.append(view[:n])
            view = view[n:]

    def get(self, queue_offset: int) -> CqEntry | None:
        pos = queue_offset * ENTRY_SIZE
        f = self.segments.find(pos)
        if f is None or queue_offset < self.min_queue_offset:
            return None
        phys, size, tags = ENTRY.unpack_from(f.view, pos - f.file_from_offset)
        return CqEntry(queue_offset, phys, size, tags)

    def entries(self, start: int, max_count: int) -> list[CqEntry]:
        """Up to `max_count` entries from queue offset `start` (blank entries included)."""
        out: list[CqEntry] = []
        qo = max(start, self.min_queue_offset)
        end = min(self.max_offset, qo + max_count)
        while qo < end:
            pos = qo * ENTRY_SIZE
            f = self.segments.find(pos)
            if f is None:
                break
            rel = pos - f.file_from_offset
            n = min(end - qo, (f.wrote_position - rel) // ENTRY_SIZE)
            for i in range(n):
                phys, size, tags = ENTRY.unpack_from(f.view, rel + i * ENTRY_SIZE)
                out.append(CqEntry(qo + i, phys, size, tags))
            qo += n
        return out

    def truncate_dirty(self, phys_end: int) -> int:
        """Drop entries pointing at or past log offset `phys_end`; returns how many."""
        lo, hi = self.min_queue_offset, self.max_offset
        while lo < hi:  # phys offsets grow along the queue: find the first entry past the end
            mid = (lo + hi) // 2
            e = self.get(mid)
            if e is not None and (e.blank or e.phys_offset + e.size <= phys_end):
                lo = mid + 1
            else:
                hi = mid
        dropped = self.max_offset - lo
        if dropped:
            pos = lo * ENTRY_SIZE
            self.segments.truncate(pos)
            last = self.segments.files[-1] if self.segments.files else None
            if last is not None and pos >= last.file_from_offset:
                rel = pos - last.file_from_offset
                last.write_at(rel, bytes(min(dropped * ENTRY_SIZE, last.file_size - rel)))
            self._refresh_tail()
        return dropped

    def correct_min_offset(self, log_min_offset: int) -> None:
        """After log files expired, the first entry still pointing into the log becomes the min."""
        qo = max(self.min_queue_offset, self.segments.min_offset // ENTRY_SIZE)
        while qo < self.max_offset:
            e = self.get(qo)
            if e is None or (not e.blank and e.phys_offset >= log_min_offset):
                break
            qo += 1
        self.min_queue_offset = qo

    def delete_expired(self, log_min_offset: int) -> int:
        """Delete whole files whose every entry points below the log's first offset."""

        def expired(f: MappedFile) -> bool:
            # The file's last entry, read from the file: get() stops at min_queue_offset.
            phys: int
            size: int
            phys, size, _ = ENTRY.unpack_from(f.view, f.file_size - ENTRY_SIZE)
            return size != 0 and phys + size <= log_min_offset

        deleted = self.segments.delete_files(expired)
        self.correct_min_offset(log_min_offset)
        return deleted

    def flush(self) -> None:
        self.segments.flush()

    def close(self) -> None:
        self.segments.close()
