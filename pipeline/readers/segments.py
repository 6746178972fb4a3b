"""CommitLog segment bytes -> runs of decoded message units, plus every byte range that is
not one. With unit_batch.py (which decodes runs of valid units), the only binary decoding in
the pipeline; pure code over a buffer (and, for runs of units, a `file_reader` of its file).

A walk follows the TOTALSIZE chain from a known unit boundary (or from the first *anchor* at
or after an arbitrary split point). Runs of valid units are decoded by `scan_units` (the C
kernel); where a run stops short, the store's segment scan (broker_runtime/store/
segment_scan.py, shared with `store verify`) says why and where the next anchor is.

Damage never stops the walk: the damaged range (from the bad unit to the next anchor) is
reported with its reason and the walk goes on from the anchor. A unit whose body CRC does
not match is emitted with crc_ok = false and also reported (`bad_crc`), one whose topic or
properties are not UTF-8 is emitted decoded with replacement and reported (`bad_text`). A
damaged range at the end of the written part of the last segment is not `final`: it may be a
write still in flight, so the next run looks again.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from broker_runtime.store import record_codec as codec
from broker_runtime.store.record_codec import RecordError
from broker_runtime.store.segment_scan import BadRange, SegmentScan
from pipeline.readers.unit_batch import Units, scan_units


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


class SegmentWalker(SegmentScan):
    """Walks message units of one segment (`file_from`: its log offset)."""

    def __init__(
        self,
        data: bytes | mmap.mmap,
        file_from: int,
        last_segment: bool,
        data_end: int = -1,
        reader: Any = None,
    ) -> None:
        """`reader`: a `file_reader` of the segment, from which runs of units are decoded
        (the searches and damage reports read `data`)."""
        super().__init__(data, file_from, last_segment, data_end)
        self.reader = reader

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
        found = self.damage(pos)
        if found.bad is not None:
            result.bad.append(found.bad)
        if found.next_unit is None:
            result.end = found.end
        return found.next_unit
