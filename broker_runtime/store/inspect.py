"""Read-only views of a store on disk: `store verify` and `store dump`.

Opens files read-only and never changes them, so it is safe next to a running broker.
Segment sizes are taken from the files themselves.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from broker_runtime.store import record_codec as codec
from broker_runtime.store.consume_queue import ENTRY, ENTRY_SIZE
from broker_runtime.store.mapped_file import MappedFile
from broker_runtime.store.record_codec import RecordError
from broker_runtime.store.segment_queue import SegmentQueue


def open_log(store_dir: Path) -> SegmentQueue:
    directory = Path(store_dir) / "commitlog"
    files = sorted(directory.glob("[0-9]" * 20)) if directory.is_dir() else []
    size = files[0].stat().st_size if files else 1 << 30
    return SegmentQueue(directory, size, readonly=True)


@dataclass
class Problem:
    kind: str  # bad_crc, torn, bad_magic, bad_size, bad_lengths, cq_mismatch, cq_missing
    where: str
    detail: str


@dataclass
class VerifyReport:
    messages: int = 0
    topics: int = 0
    queues: int = 0
    bytes: int = 0
    segments: int = 0
    bad_crcs: int = 0
    torn_tail_bytes: int = 0
    consume_queue_entries: int = 0
    consume_queue_mismatches: int = 0
    consume_queue_missing: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def consistent(self) -> bool:
        return not (
            self.bad_crcs
            or self.torn_tail_bytes
            or self.consume_queue_mismatches
            or self.consume_queue_missing
        )

    def as_dict(self, max_problems: int = 20) -> dict[str, Any]:
        d = asdict(self)
        d["problems"] = d["problems"][:max_problems]
        d["consistent"] = self.consistent
        return d


def _nonzero_end(f: MappedFile, start: int) -> int:
    data = bytes(f.view[start:]).rstrip(b"\0")
    return start + len(data)


def units(
    log: SegmentQueue, report: VerifyReport | None = None
) -> Iterator[tuple[int, memoryview, int]]:
    """(log offset, view, position) of every message unit, also past bad CRCs.

    Structural damage ends a segment; what follows it is counted as torn tail bytes.
    """
    for f in log.files:
        pos, view = 0, f.view
        while pos < f.file_size:
            try:
                size = codec.check_unit(view, pos, f.file_size, check_crc=False)
            except RecordError as e:
                if report is not None:
                    end = _nonzero_end(f, pos)
                    if end > pos:
                        report.torn_tail_bytes += end - pos
                        report.problems.append(Problem(e.reason, f"{f.path.name}+{pos}", str(e)))
                break
            if size < 0:
                break
            if report is not None and not codec.crc_ok(view, pos):
                report.bad_crcs += 1
                report.problems.append(
                    Problem("bad_crc", f"{f.path.name}+{pos}", "BODYCRC does not match")
                )
            yield f.file_from_offset + pos, view, pos
            pos += size


def verify(store_dir: Path) -> VerifyReport:
    store_dir = Path(store_dir)
    log = open_log(store_dir)
    report = VerifyReport(segments=len(log.files))
    log_min = log.min_offset
    expected: dict[tuple[str, int], dict[int, tuple[int, int]]] = {}
    try:
        for phys, view, pos in units(log, report):
            r = codec.dispatch_request(view, pos, phys)
            report.messages += 1
            report.bytes += r.size
            expected.setdefault((r.topic, r.queue_id), {})[r.queue_offset] = (phys, r.size)
    finally:
        log.close()
    report.topics = len({t for t, _ in expected})
    report.queues = len(expected)
    have = read_consume_queues(store_dir / "consumequeue", log_min)
    for key in sorted(set(expected) | set(have)):
        want, got = expected.get(key, {}), have.get(key, {})
        report.consume_queue_entries += len(got)
        for qo, entry in sorted(got.items()):
            if want.get(qo) != entry:
                report.consume_queue_mismatches += 1
                report.problems.append(
                    Problem(
                        "cq_mismatch",
                        f"{key[0]}/{key[1]}@{qo}",
                        f"entry {entry}, log {want.get(qo)}",
                    )
                )
        missing = sorted(set(want) - set(got))
        if missing:
            report.consume_queue_missing += len(missing)
            report.problems.append(
                Problem(
                    "cq_missing", f"{key[0]}/{key[1]}", f"{len(missing)} from offset {missing[0]}"
                )
            )
    return report


def read_consume_queues(
    root: Path, log_min: int
) -> dict[tuple[str, int], dict[int, tuple[int, int]]]:
    """queue -> {queue offset: (log offset, size)} for every written, unexpired entry."""
    out: dict[tuple[str, int], dict[int, tuple[int, int]]] = {}
    if not root.is_dir():
        return out
    for qdir in sorted(p for p in root.glob("*/*") if p.is_dir() and p.name.isdigit()):
        entries = out.setdefault((qdir.parent.name, int(qdir.name)), {})
        for path in sorted(qdir.glob("[0-9]" * 20)):
            data = path.read_bytes()
            base = int(path.name) // ENTRY_SIZE
            for i, (phys, size, _tags) in enumerate(ENTRY.iter_unpack(data)):
                if size in (0, 0x7FFFFFFF) or phys < log_min:
                    continue  # never written, a blank filler, or its log file expired
                entries[base + i] = (phys, size)
    return out


def dump(
    store_dir: Path, topic: str | None = None, limit: int | None = None
) -> Iterator[dict[str, Any]]:
    """Every message (or those of `topic`) as a JSON-ready dict, in log order."""
    log = open_log(Path(store_dir))
    try:
        n = 0
        for _phys, view, pos in units(log):
            if limit is not None and n >= limit:
                return
            m = codec.decode(view, pos)
            if topic is not None and m.topic != topic:
                continue
            n += 1
            d = asdict(m)
            d["born_host"] = f"{m.born_host[0]}:{m.born_host[1]}"
            d["store_host"] = f"{m.store_host[0]}:{m.store_host[1]}"
            d["body"] = base64.b64encode(m.body).decode()
            d["msg_id"] = m.msg_id
            d["magic"] = f"{m.magic & 0xFFFFFFFF:#010x}"
            d["crc_ok"] = codec.body_crc(m.body) == m.body_crc
            yield d
    finally:
        log.close()
