"""Where the message units of one CommitLog segment are, and what a damaged range is.

The one home of the rules that find units in bytes that may be damaged, used by the ingest
reader (pipeline/readers/segments.py) and by `store verify` / `store dump` (inspection.py).
Pure code over a segment's bytes (an mmap or bytes).

An *anchor* is a structurally valid unit whose PHYSICALOFFSET field is its own log offset
(a stray magic number inside a body never is one), or the blank unit closing the segment.
From a damaged unit the next anchor is where reading goes on; the range between is reported
with the codec's reason (`torn`, `bad_magic`, `bad_size`, `bad_lengths`), or `bad_offset`
(a unit whose PHYSICALOFFSET is not where it lies), `garbage` (non-zero bytes after the
zero tail), `zero_gap` (zeros followed by more units) or `no_blank` (a segment that is not
the log's last ends in zeros instead of its closing blank unit). A damaged range at the end of
the written part of the log's last segment is not `final`: it may be a write in flight.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from broker_runtime.store import record_codec as codec
from broker_runtime.store.record_codec import RecordError

_PREFIX = struct.Struct(">ii")
_MAGIC_BYTES = struct.pack(">i", codec.MESSAGE_MAGIC)
_ZERO_CHUNK = 1 << 20  # tested whole with max(): no index array
_FINE_CHUNK = 4096  # the piece of a non-zero chunk whose non-zero indexes are listed
U8 = npt.NDArray[np.uint8]
# Every reason a range of a segment's bytes is reported with (by this scan, by a reader's
# CRC and text checks, and for the bytes between a short file and the next one).
REASONS = (
    "torn", "bad_magic", "bad_size", "bad_lengths", "bad_offset", "bad_crc", "bad_text",
    "zero_gap", "garbage", "no_blank", "segment_gap",
)  # fmt: skip


def nonzero_at(arr: U8, lo: int, hi: int, last: bool) -> int | None:
    """The first (or `last`) non-zero byte of arr[lo:hi], or None.

    Chunks are tested with max() (a vectorised reduction; any() casts each byte to bool
    first), and only the 4 KiB piece that holds the byte is listed: np.flatnonzero over a
    1 MiB chunk of message data lists a million indexes.
    """
    chunks = range(lo, hi, _ZERO_CHUNK)
    for c in reversed(chunks) if last else chunks:
        c_hi = min(hi, c + _ZERO_CHUNK)
        if not arr[c:c_hi].max(initial=0):
            continue
        pieces = range(c, c_hi, _FINE_CHUNK)
        for p in reversed(pieces) if last else pieces:
            nz = np.flatnonzero(arr[p : min(c_hi, p + _FINE_CHUNK)])
            if len(nz):
                return p + int(nz[-1] if last else nz[0])
    return None


@dataclass(frozen=True)
class BadRange:
    """Bytes that are not a message; `position` is relative to the segment file."""

    position: int
    length: int
    reason: str
    detail: str
    final: bool


@dataclass(frozen=True)
class Damage:
    """What `SegmentScan.damage` found at a position that holds no good unit."""

    bad: BadRange | None  # None: nothing to report (zeros to the end, the closing blank)
    next_unit: int | None  # where reading goes on; None: the segment has nothing more
    end: int  # where the walk's end is set: the next run starts there if nothing follows


class SegmentScan:
    """Finds units in one segment's bytes (`file_from`: its log offset)."""

    def __init__(
        self, data: bytes | mmap.mmap, file_from: int, last_segment: bool, data_end: int = -1
    ) -> None:
        """`data_end`: the segment's data end if the caller knows it (saves a scan)."""
        self.data = data  # an mmap or bytes: both have .find
        self.buf = memoryview(data)
        self.arr: U8 = np.frombuffer(self.buf, dtype=np.uint8)
        self.size = len(self.buf)
        self.file_from = file_from
        self.last_segment = last_segment
        self._data_end: int | None = data_end if data_end >= 0 else None

    def data_end(self) -> int:
        """Position just past the last non-zero byte of the segment."""
        if self._data_end is None:
            last = nonzero_at(self.arr, 0, self.size, last=True)
            self._data_end = 0 if last is None else last + 1
        return self._data_end

    def unit_ok(self, pos: int) -> int:
        """Size of a valid unit at `pos` (<0: blank), raising RecordError like the codec.

        Adds `bad_offset`: the unit's PHYSICALOFFSET field is not its own log offset.
        """
        size = codec.check_unit(self.buf, pos, self.size, check_crc=False)
        if size > 0:
            phys = int.from_bytes(self.buf[pos + 28 : pos + 36], "big", signed=True)
            if phys != self.file_from + pos:
                detail = f"PHYSICALOFFSET {phys} at log offset {self.file_from + pos}"
                raise RecordError("bad_offset", pos, detail)
        return size

    def anchor(self, start: int) -> int | None:
        """The first position >= `start` where a valid unit (or the closing blank) begins."""
        find = self.data.find
        blank = self.data_end() - 8
        if blank < start or not self._is_blank(blank):
            blank = -1
        at = start + 4
        while True:
            hit = find(_MAGIC_BYTES, at, self.size)
            if hit < 0 or 0 <= blank < hit - 4:
                return blank if blank >= 0 else None
            try:
                self.unit_ok(hit - 4)
                return hit - 4
            except RecordError:
                at = hit + 1

    def _is_blank(self, pos: int) -> bool:
        if pos < 0 or pos + 8 > self.size:
            return False
        total, magic = _PREFIX.unpack_from(self.buf, pos)
        return bool(magic == codec.BLANK_MAGIC and total == self.size - pos)

    def first_nonzero(self, start: int) -> int | None:
        """The first non-zero byte at or after `start`: none past the data end, so the zeros
        of a segment's unwritten part (most of the last one) are never read."""
        return nonzero_at(self.arr, start, self.data_end(), last=False)

    def damage(self, pos: int) -> Damage:
        """What is at `pos` (not a unit the caller could take) and where reading goes on."""
        try:
            size = self.unit_ok(pos)
        except RecordError as e:
            reason, detail = e.reason, str(e)
        else:
            if size < 0:
                return Damage(None, None, self.size)  # the blank unit: the segment is done
            # The codec accepts what the caller's check refused: report it, go on past it.
            bad = BadRange(pos, size, "bad_lengths", "field check failed", True)
            return Damage(bad, pos + size, pos + size)
        if reason == "eof":
            nonzero = self.first_nonzero(pos)
            if nonzero is None:
                if self.last_segment or pos >= self.size:
                    return Damage(None, None, pos)  # zeros to the end: the next unit goes here
                detail = f"{self.size - pos} zero bytes end the segment, no closing blank unit"
                bad = BadRange(pos, self.size - pos, "no_blank", detail, True)
                return Damage(bad, None, self.size)
            # A unit's first non-zero byte is one of its 4 TOTALSIZE bytes.
            nxt = self.anchor(max(pos + 1, nonzero - 3))
            if nxt is not None and not self.arr[pos:nxt].any():
                reason, detail = "zero_gap", f"{nxt - pos} zero bytes before more units"
            else:
                reason, detail = "garbage", f"non-zero bytes at {nonzero} after the zero tail"
        else:
            nxt = self.anchor(pos + 1)
        final = nxt is not None or not self.last_segment
        magic = _PREFIX.unpack_from(self.buf, pos)[1] if pos + 8 <= self.size else 0
        if not final and magic == codec.MESSAGE_MAGIC:
            reason, detail = "torn", f"{detail} (the log's last unit: torn or in flight)"
        if nxt is not None:
            end = nxt
        else:  # a segment before the last is accounted for to its end
            end = max(self.data_end(), pos + 1) if self.last_segment else self.size
        # A pending tail ends the units where it starts to be read again; else the segment.
        bad = BadRange(pos, end - pos, reason, detail, final)
        return Damage(bad, nxt, self.size if final else end)
