"""Read-only views of a store on disk: `store verify` and `store dump`.

Opens files read-only and never changes them, so it is safe next to a running broker.
Damage never stops a scan: each damaged range is reported (file, position, log offset,
length, reason) and the scan goes on at the next unit, found as the ingest reader finds it
(segment_scan.py). A unit whose topic or properties are not UTF-8 is read with replacement
characters and reported (`bad_text`); a segment file of another size than the store's is
reported, and the bytes between its end and the next file's start are a `segment_gap`.
"""

from __future__ import annotations

import base64
import mmap
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from broker_runtime.common.java_hash import tags_code
from broker_runtime.common.message import TAGS, StoredMessage
from broker_runtime.common.topics import SCHEDULE_TOPIC
from broker_runtime.store import record_codec as codec
from broker_runtime.store.consume_queue import ENTRY, ENTRY_SIZE
from broker_runtime.store.mapped_file import NAME_DIGITS, segment_name
from broker_runtime.store.message_store import read_layout
from broker_runtime.store.segment_scan import BadRange, SegmentScan


@dataclass
class Problem:
    """One finding; damage in the log has its file, position, log offset and length."""

    kind: str  # a damage reason, bad_crc, bad_text, cq_mismatch, cq_missing
    where: str
    detail: str
    file: str | None = None
    position: int | None = None  # in the file
    log_offset: int | None = None
    length: int | None = None


@dataclass
class VerifyReport:
    messages: int = 0
    topics: int = 0
    queues: int = 0
    bytes: int = 0
    segments: int = 0
    segment_size: int = 0
    bad_crcs: int = 0
    bad_texts: int = 0
    damaged_ranges: int = 0
    damaged_bytes: int = 0  # in damaged ranges (a bad CRC or text is a message: not here)
    torn_tail_bytes: int = 0  # a damaged range at the end of the log (a torn last write)
    consume_queue_entries: int = 0
    consume_queue_mismatches: int = 0
    consume_queue_missing: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def consistent(self) -> bool:
        return not (
            self.bad_crcs
            or self.bad_texts
            or self.damaged_ranges
            or self.consume_queue_mismatches
            or self.consume_queue_missing
        )

    def as_dict(self, max_queue_problems: int = 20) -> dict[str, Any]:
        """Every problem in the log, and the first ConsumeQueue ones."""
        d = asdict(self)
        log = [p for p in d["problems"] if p["file"] is not None]
        queues = [p for p in d["problems"] if p["file"] is None]
        d["problems"] = log + queues[:max_queue_problems]
        d["problems_not_shown"] = max(0, len(queues) - max_queue_problems)
        d["consistent"] = self.consistent
        return d


def segment_files(store_dir: Path) -> list[Path]:
    directory = Path(store_dir) / "commitlog"
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.name.isdigit() and len(p.name) == NAME_DIGITS)


def segment_size(store_dir: Path, files: list[Path]) -> int:
    """The store's segment size: as recorded at creation, else its largest file's."""
    layout = read_layout(Path(store_dir))
    if layout is not None:
        return layout["segment_size"]
    return max((p.stat().st_size for p in files), default=1 << 30)


Report = Callable[[Problem], None]


def _damage(path: Path, file_from: int, bad: BadRange) -> Problem:
    return Problem(
        bad.reason,
        f"{path.name}+{bad.position}",
        bad.detail,
        path.name,
        bad.position,
        file_from + bad.position,
        bad.length,
    )


def units(store_dir: Path, report: Report | None = None) -> Iterator[tuple[int, memoryview, int]]:
    """(log offset, view, position) of every structurally valid unit, also past damage.

    `report` gets each damaged range and each file of another size than the store's; a
    unit with a bad CRC is yielded (the caller checks CRCs).
    """
    files = segment_files(store_dir)
    size = segment_size(store_dir, files)
    for i, path in enumerate(files):
        file_from = int(path.name)
        last = i == len(files) - 1
        yield from _segment_units(path, file_from, last, report)
        if report is None:
            continue
        length = path.stat().st_size
        gap = int(files[i + 1].name) - file_from - length if not last else 0
        if gap > 0:
            detail = (
                f"{length}-byte file (segments here are {size}); "
                f"the next one starts {gap} bytes after it"
            )
            report(_damage(path, file_from, BadRange(length, gap, "segment_gap", detail, True)))
        elif length != size:
            detail = f"{path.name} is {length} bytes, segments here are {size}"
            bad = BadRange(min(length, size), abs(size - length), "segment_size", detail, True)
            report(_damage(path, file_from, bad))


def _segment_units(
    path: Path, file_from: int, last: bool, report: Report | None
) -> Iterator[tuple[int, memoryview, int]]:
    with open(path, "rb") as f:
        length = f.seek(0, 2)
        data: bytes | mmap.mmap = (
            mmap.mmap(f.fileno(), length, prot=mmap.PROT_READ) if length else b""
        )

    def damaged(bad: BadRange) -> None:
        if report is not None:
            report(_damage(path, file_from, bad))

    try:
        yield from segment_units(data, file_from, last, damaged)
    finally:
        if isinstance(data, mmap.mmap):
            try:
                data.close()
            except BufferError:
                pass  # a caller still holds a view: unmapped when it goes


def segment_units(
    data: bytes | mmap.mmap, file_from: int, last: bool, damaged: Callable[[BadRange], None]
) -> Iterator[tuple[int, memoryview, int]]:
    """`units` of one segment's bytes; each damaged range goes to `damaged`."""
    scan = SegmentScan(data, file_from, last)
    pos: int | None = 0
    while pos is not None and pos < scan.size:
        try:
            size = scan.unit_ok(pos)
        except codec.RecordError:
            found = scan.damage(pos)
            if found.bad is not None:
                damaged(found.bad)
            pos = found.next_unit
            continue
        if size < 0:
            break  # the closing blank unit
        yield file_from + pos, scan.buf, pos
        pos += size


def verify(store_dir: Path) -> VerifyReport:
    store_dir = Path(store_dir)
    files = segment_files(store_dir)
    report = VerifyReport(segments=len(files), segment_size=segment_size(store_dir, files))

    def damaged(p: Problem) -> None:
        report.problems.append(p)
        report.damaged_ranges += 1
        report.damaged_bytes += p.length or 0
        if p.kind == "torn":
            report.torn_tail_bytes += p.length or 0

    expected: dict[tuple[str, int], dict[int, tuple[int, int, int | None]]] = {}
    for phys, view, pos in units(store_dir, damaged):
        m, text_ok = _decode(view, pos)
        if not codec.crc_ok(view, pos):
            report.bad_crcs += 1
            report.problems.append(_unit_problem("bad_crc", phys, pos, "BODYCRC does not match", m))
        if not text_ok:
            report.bad_texts += 1
            detail = "topic or properties are not UTF-8 (read with replacement)"
            report.problems.append(_unit_problem("bad_text", phys, pos, detail, m))
        report.messages += 1
        report.bytes += m.total_size
        tags = None if m.topic == SCHEDULE_TOPIC else tags_code(m.properties.get(TAGS))
        expected.setdefault((m.topic, m.queue_id), {})[m.queue_offset] = (phys, m.total_size, tags)
    report.topics = len({t for t, _ in expected})
    report.queues = len(expected)
    log_min = int(files[0].name) if files else 0
    _compare_queues(report, expected, read_consume_queues(store_dir / "consumequeue", log_min))
    return report


def _unit_problem(kind: str, phys: int, pos: int, detail: str, m: StoredMessage) -> Problem:
    name = segment_name(phys - pos)
    return Problem(kind, f"{name}+{pos}", detail, name, pos, phys, m.total_size)


def _decode(view: memoryview, pos: int) -> tuple[StoredMessage, bool]:
    """The unit at `pos`, and whether its topic and properties were UTF-8."""
    try:
        return codec.decode(view, pos), True
    except UnicodeDecodeError:
        return codec.decode(view, pos, errors="replace"), False


def _compare_queues(
    report: VerifyReport,
    expected: dict[tuple[str, int], dict[int, tuple[int, int, int | None]]],
    have: dict[tuple[str, int], dict[int, tuple[int, int, int]]],
) -> None:
    for key in sorted(set(expected) | set(have)):
        want, got = expected.get(key, {}), have.get(key, {})
        report.consume_queue_entries += len(got)
        for qo, entry in sorted(got.items()):
            w = want.get(qo)
            if w is None or w[:2] != entry[:2] or w[2] not in (None, entry[2]):
                report.consume_queue_mismatches += 1
                report.problems.append(
                    Problem("cq_mismatch", f"{key[0]}/{key[1]}@{qo}", f"entry {entry}, log {w}")
                )
        missing = sorted(set(want) - set(got))
        if missing:
            report.consume_queue_missing += len(missing)
            report.problems.append(
                Problem(
                    "cq_missing", f"{key[0]}/{key[1]}", f"{len(missing)} from offset {missing[0]}"
                )
            )


def read_consume_queues(
    root: Path, log_min: int
) -> dict[tuple[str, int], dict[int, tuple[int, int, int]]]:
    """queue -> {queue offset: (log offset, size, tag code)} for every written, unexpired
    entry."""
    out: dict[tuple[str, int], dict[int, tuple[int, int, int]]] = {}
    if not root.is_dir():
        return out
    for qdir in sorted(p for p in root.glob("*/*") if p.is_dir() and p.name.isdigit()):
        entries = out.setdefault((qdir.parent.name, int(qdir.name)), {})
        for path in sorted(qdir.glob("[0-9]" * 20)):
            data = path.read_bytes()
            base = int(path.name) // ENTRY_SIZE
            usable = len(data) - len(data) % ENTRY_SIZE
            for i, (phys, size, tags) in enumerate(ENTRY.iter_unpack(data[:usable])):
                if size in (0, 0x7FFFFFFF) or phys < log_min:
                    continue  # never written, a blank filler, or its log file expired
                entries[base + i] = (phys, size, tags)
    return out


def dump(
    store_dir: Path,
    topic: str | None = None,
    limit: int | None = None,
    skipped: Report | None = None,
) -> Iterator[dict[str, Any]]:
    """Every message (or those of `topic`) as a JSON-ready dict, in log order; damaged
    ranges go to `skipped` (a unit with a bad CRC or text is a message: it is dumped)."""
    n = 0
    for _phys, view, pos in units(Path(store_dir), skipped):
        if limit is not None and n >= limit:
            return
        m, text_ok = _decode(view, pos)
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
        d["text_ok"] = text_ok
        yield d
