"""What a broker does with its store at start: find the last good message, cut what follows,
and bring the ConsumeQueues and the index back in line with the log.

The scan starts at the segment holding the checkpoint's safe offset and checks every unit
(TOTALSIZE, magic, field lengths, body CRC). The first bad or missing unit ends the log:
bytes after it are saved under `recovery/` and then zeroed, later segments are moved there,
entries pointing past the end are dropped, and entries missing before it are re-dispatched.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker_runtime.store.checkpoint import Checkpoint
from broker_runtime.store.commit_log import ScanStop
from broker_runtime.store.mapped_file import MappedFile, segment_name

if TYPE_CHECKING:
    from broker_runtime.store.message_store import MessageStore

_CHUNK = 1 << 20


@dataclass
class RecoveryReport:
    unclean_shutdown: bool
    checkpoint: dict[str, int] | None
    scanned_from: int
    log_min_offset: int = 0
    log_end: int = 0
    messages_checked: int = 0
    stop_reason: str = "eof"
    stop_detail: str = ""
    truncated_bytes: int = 0
    saved: list[str] = field(default_factory=list)
    consume_queue_entries_dropped: int = 0
    index_truncated: bool = False
    redispatched_from: int = 0
    redispatched_messages: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _segment_start(store: MessageStore, offset: int) -> int:
    segs = store.commit_log.segments
    if not segs.files:
        return 0
    offset = min(max(offset, segs.min_offset), segs.files[-1].file_from_offset)
    return offset - (offset - segs.min_offset) % segs.file_size


def _last_nonzero(f: MappedFile, start: int) -> int:
    """Position just past the last non-zero byte of `f` at or after `start` (else `start`)."""
    end = f.file_size
    while end > start:
        lo = max(start, end - _CHUNK)
        chunk = bytes(f.view[lo:end]).rstrip(b"\0")
        if chunk:
            return lo + len(chunk)
        end = lo
    return start


def _truncate_log(store: MessageStore, end: int, report: RecoveryReport) -> None:
    segs = store.commit_log.segments
    saved_dir = store.root / "recovery"
    for f in [f for f in segs.files if f.file_from_offset > end]:
        saved_dir.mkdir(exist_ok=True)
        target = _unused(saved_dir / f"{f.path.name}.segment")
        report.truncated_bytes += _last_nonzero(f, 0)
        f.path.rename(target)
        report.saved.append(str(target))
    segs.truncate(end)  # the moved files are closed and dropped from the queue
    last = segs.find(end) or (segs.files[-1] if segs.files else None)
    if last is None or end < last.file_from_offset:
        return
    rel = end - last.file_from_offset
    dirty_end = _last_nonzero(last, rel)
    if dirty_end > rel:
        saved_dir.mkdir(exist_ok=True)
        target = _unused(saved_dir / f"{segment_name(end)}.torn")
        target.write_bytes(bytes(last.view[rel:dirty_end]))
        report.saved.append(str(target))
        report.truncated_bytes += dirty_end - rel
        last.write_at(rel, bytes(dirty_end - rel))
        last.flush(force=True)
    last.wrote_position = last.flushed_position = rel


def _unused(path: Path) -> Path:
    """`path`, or `path.1`, `path.2`...: an earlier recovery's copy is never overwritten."""
    n, candidate = 0, path
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}.{n}")
    return candidate


def recover(store: MessageStore) -> RecoveryReport:
    log = store.commit_log
    segs = log.segments
    cp = Checkpoint.load(store.checkpoint_file)
    safe = min(cp.phys_flushed_offset, cp.logics_flushed_offset) if cp else segs.min_offset
    start = _segment_start(store, safe)
    report = RecoveryReport(
        unclean_shutdown=store.abort_file.exists(),
        checkpoint=dataclasses.asdict(cp) if cp else None,
        scanned_from=start,
    )
    stop = ScanStop(start, "eof", "")
    for _ in log.scan(start, check_crc=True, stop=stop):
        report.messages_checked += 1
    end = stop.offset if segs.files else 0
    report.stop_reason, report.stop_detail = stop.reason, stop.detail
    if segs.files:
        _truncate_log(store, end, report)
    report.log_end, report.log_min_offset = segs.max_offset, segs.min_offset

    for cq in store.queues().values():
        report.consume_queue_entries_dropped += cq.truncate_dirty(end)
        cq.correct_min_offset(segs.min_offset)
    index = store.index
    if index is not None and index.files and index.max_indexed_phys_offset() >= end:
        index.truncate_from(end)
        report.index_truncated = True

    # Re-dispatch what the ConsumeQueues or the index may lack; both skip what they have.
    redo = min(start, cp.logics_flushed_offset if cp else segs.min_offset)
    if not store.queues():
        redo = segs.min_offset
    if index is not None:
        redo = min(redo, index.rebuild_from_offset())
    redo = _segment_start(store, redo)
    report.redispatched_from = redo
    requests = log.dispatch_requests(redo)
    while batch := list(islice(requests, 4096)):
        report.redispatched_messages += len(batch)
        store.dispatcher.apply(batch)
    store.dispatcher.dispatched_offset = end

    log.queue_offsets = {key: cq.max_offset for key, cq in store.queues().items()}
    return report
