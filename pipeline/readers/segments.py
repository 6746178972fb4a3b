"""CommitLog segment bytes -> runs of decoded message units, plus every byte range that is
not one. With unit_batch.py (which decodes runs of valid units), the only binary decoding in
the pipeline; pure code over a buffer (and, for runs of units, a `file_reader` of its file).

A walk follows the TOTALSIZE chain from a known unit boundary (or from the first *anchor* at
or after an arbitrary split point: a structurally valid unit whose PHYSICALOFFSET field is
its own log offset, which a stray magic number inside a body never has). Runs of valid units
are decoded by `scan_units` (the C kernel); where a run stops short, the broker's codec
says why.

Damage never stops the walk: the damaged range (from the bad unit to the next anchor) is
reported with the codec's reason (`torn`, `bad_magic`, `bad_size`, `bad_lengths`), or
`bad_offset` (a unit whose PHYSICALOFFSET is not where it lies), `garbage` (non-zero bytes
after the zero tail) or `zero_gap` (zeros followed by more units), and the walk goes on from
the anchor. A unit whose body CRC does not match is emitted with crc_ok = false and also
reported (`bad_crc`), one whose topic or properties are not UTF-8 is emitted decoded with
replacement and reported (`bad_text`). A damaged range at the end of the written part of the
last segment is not `final`: it may be a write still in flight, so the next run looks again.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from broker_runtime.store import record_codec as codec
from broker_runtime.store.record_codec import RecordError
from pipeline.readers.unit_batch import Units, scan_units

_PREFIX = struct.Struct(">ii")
_MAGIC_BYTES = struct.pack(">i", codec.MESSAGE_MAGIC)
_ZERO_CHUNK = 1 << 20  # tested whole with max(): no index array
_FINE_CHUNK = 4096  # the piece of a non-zero chunk whose non-zero indexes are listed
U8 = npt.NDArray[np.uint8]


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


@dataclass
class WalkResult:
    """What a walk over one range found besides its messages."""

    units: int = 0
    unit_bytes: int = 0
    end: int = 0  # segment position where the walk stopped (first unit start >= stop, or EOD)
    bad: list[BadRange] = field(default_factory=list)

    @property
    def pending_from(self) -> int | None:
        """Where a non-final damaged tail starts (the next run starts there), if any."""
        return next((b.position for b in self.bad if not b.final), None)


class SegmentWalker:
    """Walks message units of one segment (`file_from`: its log offset)."""

    def __init__(
        self,
        data: bytes | mmap.mmap,
        file_from: int,
        last_segment: bool,
        data_end: int = -1,
        reader: Any = None,
    ) -> None:
        """`data_end`: the segment's data end if the caller knows it (saves a scan);
        `reader`: a `file_reader` of the segment, from which runs of units are decoded
        (the searches and damage reports read `data`)."""
        self.data = data  # an mmap or bytes: both have .find
        self.reader = reader
        self.buf = memoryview(data)
        self.arr: U8 = np.frombuffer(self.buf, dtype=np.uint8)
        self.size = len(self.buf)
        self.file_from = file_from
        self.last_segment = last_segment
        self._data_end: int | None = data_end if data_end >= 0 else None

    # -- finding things -------------------------------------------------------------------

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

    # -- the walk -------------------------------------------------------------------------

    def walk(self, start: int, stop: int, exact: bool, result: WalkResult) -> Iterator[Units]:
        """Yield runs of the valid units that start in [start, stop).

        Damage starting before the first good unit at or past `stop` is this range's to
        report. Sets `result.end` to where the walk stopped: that unit's start, the end of
        the written data, or the segment's end after its blank unit.
        """
        pos: int | None = start if exact else self.anchor(start)
        result.end = -1  # nothing starts in this range (stays so if there is no anchor)
        while pos is not None and pos < stop:
            units = scan_units(self.data, self.file_from, pos, stop, reader=self.reader)
            pos = units.end
            torn = -1
            if self.last_segment and units.n and pos >= self.data_end():
                # The log's last unit: a bad CRC here is a torn write (or one in flight).
                tail = int(units.column("phys", np.int64)[-1]) - self.file_from
                if not units.crc_ok()[-1]:
                    detail = "the last unit of the log fails its CRC (torn or in flight)"
                    result.bad.append(BadRange(tail, pos - tail, "torn", detail, False))
                    units, torn = units.head(units.n - 1), tail
            if units.n:
                self._account(units, result)
                yield units
            if torn >= 0:
                result.end = torn  # the next run starts there
                return
            if pos >= stop or units.full:
                continue
            pos = self._skip_damage(pos, result)
        if pos is not None and pos < self.size:
            # The unit at or past `stop` belongs to the next range if it is good; if it is
            # damaged, this range reports it (the next range's anchor search skips it).
            try:
                good_next = self.unit_ok(pos) > 0
            except RecordError:
                good_next = False
            if not good_next:
                nxt = self._skip_damage(pos, result)
                pos = nxt if nxt is not None else None
        if pos is not None:
            result.end = pos

    def _account(self, units: Units, result: WalkResult) -> None:
        """Count the run and report its units with a bad CRC or text."""
        phys = units.column("phys", np.int64)
        total = units.column("total", np.int32)
        stored, body_len = units.column("crc", np.int32), units.column("body_len", np.int32)
        for i in np.flatnonzero(~units.crc_ok()).tolist():
            pos = int(phys[i]) - self.file_from
            body = pos + codec.HEADER_SIZE
            actual = codec.body_crc(self.buf[body : body + int(body_len[i])])
            detail = f"BODYCRC {int(stored[i])}, body CRC {actual}"
            result.bad.append(BadRange(pos, int(total[i]), "bad_crc", detail, True))
        for i in (i for i in units.bad_text if i < units.n):
            detail = "topic or properties are not UTF-8 (kept with replacement)"
            pos = int(phys[i]) - self.file_from
            result.bad.append(BadRange(pos, int(total[i]), "bad_text", detail, True))
        result.units += units.n
        result.unit_bytes += int(total.sum(dtype=np.int64))

    def _skip_damage(self, pos: int, result: WalkResult) -> int | None:
        """Record what is at `pos` (not a good unit); return where the walk goes on, or None
        (with `result.end` set) when the segment has nothing more."""
        try:
            size = self.unit_ok(pos)
        except RecordError as e:
            reason, detail = e.reason, str(e)
        else:
            if size < 0:
                result.end = self.size  # the blank unit: the segment is done
                return None
            # The codec accepts what the vectorised check refused: keep the walk going.
            result.bad.append(BadRange(pos, size, "bad_lengths", "field check failed", True))
            return pos + size
        if reason == "eof":
            nonzero = self.first_nonzero(pos)
            if nonzero is None:
                result.end = pos  # zeros to the end: the next unit will be written here
                return None
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
        end = nxt if nxt is not None else max(self.data_end(), pos + 1)
        result.bad.append(BadRange(pos, end - pos, reason, detail, final))
        result.end = end if not final else self.size
        return nxt
