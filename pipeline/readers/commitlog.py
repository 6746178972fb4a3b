"""Plan a broker's CommitLog into byte ranges (one Spark task each) and read one range.

Ranges split segments at fixed byte positions; a range owns the units that *start* in it
(a walk from a split point begins at the first anchor, see segments.py), so ranges can be
read in parallel and in any order and still give every unit exactly once.
"""

from __future__ import annotations

import errno
import mmap
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from broker_runtime.common.constants import DEFAULT_CLUSTER
from broker_runtime.store.mapped_file import NAME_DIGITS
from broker_runtime.store.segment_scan import BadRange, nonzero_at
from pipeline.readers.segments import SegmentWalker, WalkResult
from pipeline.readers.unit_batch import IMPLEMENTATION, file_reader

DEFAULT_RANGE_BYTES = 64 << 20


@dataclass(frozen=True)
class Broker:
    """One broker replica's store directory."""

    name: str
    broker_id: int  # 0 master, 1 slave
    store_dir: str
    cluster: str = DEFAULT_CLUSTER  # brokerClusterName

    @property
    def replica(self) -> tuple[str, str, int]:
        """(cluster, broker name, broker id): what names this replica in the lake."""
        return (self.cluster, self.name, self.broker_id)


@dataclass(frozen=True)
class RangeTask:
    cluster: str
    broker: str
    broker_id: int
    path: str  # the segment file
    file_from: int  # its log offset
    start: int  # segment positions: the range [start, stop)
    stop: int
    exact: bool  # `start` is a known unit boundary (no anchor search)
    last_segment: bool
    data_end: int = -1  # the segment's data end when planned (-1: the reader finds it)
    next_from: int = -1  # the next segment's log offset (-1: this is the last segment)

    @property
    def range_id(self) -> str:
        return f"{self.cluster}/{self.broker}/{self.broker_id}/{self.file_from + self.start}"

    def as_row(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LogPlan:
    tasks: list[RangeTask]
    log_min: int  # first offset still in the log (older files expired)
    plan_end: int  # where the ranges end: the data end, or `start` if that is past it
    start: int  # where this run starts (>= log_min)
    data_end: int  # just past the last non-zero byte (a unit may end in 2 zero bytes after it)


def segment_files(store_dir: str | Path) -> list[Path]:
    directory = Path(store_dir) / "commitlog"
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.name.isdigit() and len(p.name) == NAME_DIGITS)


def _data_end(path: Path) -> int:
    """Position just past the segment's last non-zero byte.

    Reads backwards with pread from the end of the file's last data extent (holes of a
    sparse segment are skipped, not read): no mapping, so the driver's memory stays flat.
    """
    chunk = 1 << 20
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        end = _extent_end(fd, os.fstat(fd).st_size)
        while end > 0:
            lo = max(0, end - chunk)
            tail = np.frombuffer(os.pread(fd, end - lo, lo), dtype=np.uint8)
            last = nonzero_at(tail, 0, len(tail), last=True)
            if last is not None:
                return lo + last + 1
            end = lo
        return 0


def _extent_end(fd: int, size: int) -> int:
    """End of the file's last data extent (its size where the file system cannot say)."""
    end = pos = 0
    try:
        while True:
            pos = os.lseek(fd, os.lseek(fd, pos, os.SEEK_DATA), os.SEEK_HOLE)
            end = pos
    except OSError as e:
        return end if e.errno == errno.ENXIO else size  # ENXIO: no data past `pos`


def plan_log(
    broker: Broker,
    start_offset: int,
    range_bytes: int = DEFAULT_RANGE_BYTES,
    until: int | None = None,
) -> LogPlan:
    """Ranges covering the log from `start_offset` (a unit boundary) to its written end
    (or to `until`, a resumed run's recorded end, if that comes first)."""
    files = segment_files(broker.store_dir)
    if not files:
        return LogPlan([], 0, start_offset, start_offset, 0)
    log_min = int(files[0].name)
    start = max(start_offset, log_min)
    last = files[-1]
    data_end = int(last.name) + _data_end(last)
    plan_end = data_end if until is None else min(data_end, until)
    tasks = []
    for path, after in zip(files, [*files[1:], None], strict=True):
        file_from = int(path.name)
        size = path.stat().st_size
        if file_from + size <= start or file_from >= plan_end:
            continue
        is_last = path == last
        seg_start = max(0, start - file_from)
        seg_stop = plan_end - file_from if is_last else size
        # Known here once per file, it saves each range's reader a search of the file's end.
        seg_data_end = data_end - file_from if is_last else _data_end(path)
        pos = seg_start
        while pos < seg_stop:
            stop = min(seg_stop, pos + range_bytes)
            exact = pos == seg_start
            task = RangeTask(
                broker.cluster, broker.name, broker.broker_id, str(path), file_from, pos, stop,
                exact, is_last,
                seg_data_end, -1 if after is None else int(after.name),
            )  # fmt: skip
            tasks.append(task)
            pos = stop
    return LogPlan(tasks, log_min, max(plan_end, start), start, data_end)


def read_range(task: RangeTask, result: WalkResult) -> Iterator[pa.RecordBatch]:
    """RAW_MESSAGE batches (with the PICKED property columns) of the units starting in the
    task's range; damage goes to `result`."""
    with open(task.path, "rb") as f:
        m = mmap.mmap(f.fileno(), os.fstat(f.fileno()).st_size, prot=mmap.PROT_READ)
        reader = file_reader(f.fileno())
    # Runs of units are decoded from the file's bytes read through the reader; the map serves
    # the searches (anchors, the data end) and damage reports, so few of its pages are touched.
    walker = SegmentWalker(m, task.file_from, task.last_segment, task.data_end, reader)
    try:
        for units in walker.walk(task.start, task.stop, task.exact, result):
            yield units.to_batch(task.broker, task.broker_id)
        gap = task.next_from - task.file_from - walker.size
        if gap > 0 and task.stop >= walker.size:  # the file ends before the next one starts
            detail = f"{walker.size}-byte file, the next segment starts {gap} bytes after it"
            result.bad.append(BadRange(walker.size, gap, "segment_gap", detail, True))
    finally:
        del walker, reader
        _close(m)


def _close(m: mmap.mmap) -> None:
    try:
        m.close()
    except BufferError:
        pass  # a view is still alive (an exception's frames): unmapped when it goes


def summary(task: RangeTask, result: WalkResult) -> dict[str, Any]:
    """What the driver needs of a finished range (plain types: it travels by accumulator)."""
    return {
        "cluster": task.cluster,
        "broker": task.broker,
        "broker_id": task.broker_id,
        "file": Path(task.path).name,
        "file_from": task.file_from,
        "start": task.file_from + task.start,
        "bytes": task.stop - task.start,
        "reader": IMPLEMENTATION,  # the decoder the worker that read the range loaded
        "units": result.units,
        "unit_bytes": result.unit_bytes,
        "end": task.file_from + result.end if result.end >= 0 else -1,
        "pending_from": (
            task.file_from + result.pending_from if result.pending_from is not None else None
        ),
        "bad": [
            {
                "position": b.position,
                "log_offset": task.file_from + b.position,
                "length": b.length,
                "reason": b.reason,
                "detail": b.detail,
                "final": b.final,
            }
            for b in result.bad
        ],
    }
