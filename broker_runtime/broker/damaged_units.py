"""Units a pull cannot deliver (damaged on disk), and the ones an operator skipped.

A pull stops at a damaged unit: a consumer checks every unit of a pull body (CRC, lengths,
text) and refuses the whole body, so it would ask for the same offset for ever. The broker
logs the position once and lists it in GET_BROKER_RUNTIME_INFO (`damagedUnits`).
`mqaudit store skip-unit` records an operator's skip in config/skippedUnits.json (written
atomically, `.bak` kept; who, when, why); pulls then pass over the unit. The broker re-reads
the file when it changes, so a skip needs no restart.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from broker_runtime.offsets.json_file import read_with_backup, write_atomic
from broker_runtime.store import inspection
from broker_runtime.store import record_codec as codec

SKIP_FILE = Path("config") / "skippedUnits.json"
log = logging.getLogger(__name__)
Key = tuple[str, int, int]  # topic, queue id, queue offset


@dataclass(frozen=True)
class DamagedUnit:
    topic: str
    queue_id: int
    queue_offset: int
    phys_offset: int
    size: int
    reason: str


def unit_damage(raw: bytes, phys_offset: int) -> str | None:
    """Why the unit a ConsumeQueue entry points at cannot be delivered, or None."""
    try:
        size = codec.check_unit(raw, 0, len(raw))
    except codec.RecordError as e:
        return str(e)
    if size != len(raw):
        return f"a unit of {abs(size)} bytes where the entry says {len(raw)}"
    at = int.from_bytes(raw[28:36], "big", signed=True)
    if at != phys_offset:
        return f"PHYSICALOFFSET {at} where the entry points at {phys_offset}"
    t = codec.HEADER_SIZE + int.from_bytes(raw[codec.HEADER_SIZE - 4 : codec.HEADER_SIZE], "big")
    try:
        raw[t + 1 : t + 1 + raw[t]].decode()
        raw[t + 3 + raw[t] :].decode()
    except UnicodeDecodeError as e:
        return f"topic or properties are not UTF-8: {e}"
    return None


class DamagedUnits:
    """The damaged units pulls met, and the skips recorded in the store's SKIP_FILE."""

    def __init__(self, store_dir: Path) -> None:
        self.path = Path(store_dir) / SKIP_FILE
        self.met: dict[Key, DamagedUnit] = {}
        self._skips: dict[Key, dict[str, Any]] = {}
        self._stamp: float | None = None

    def skipped(self, unit: DamagedUnit) -> bool:
        """Whether an operator skipped `unit`; a unit not skipped is reported (once)."""
        key = (unit.topic, unit.queue_id, unit.queue_offset)
        self._reload()
        if key in self._skips:
            if self.met.pop(key, None) is not None:
                log.warning("passing over skipped damaged unit %s", self._skips[key])
            return True
        if key not in self.met:
            self.met[key] = unit
            log.error(
                "damaged unit: %s/%d queue offset %d at log offset %d (%d bytes): %s; pulls "
                "stop here until an operator skips it (mqaudit store skip-unit)",
                *(unit.topic, unit.queue_id, unit.queue_offset, unit.phys_offset, unit.size),
                unit.reason,
            )
        return False

    def status(self) -> list[dict[str, Any]]:
        return [asdict(u) for u in self.met.values()]

    def _reload(self) -> None:
        try:
            stamp = os.stat(self.path).st_mtime
        except FileNotFoundError:
            stamp = None
        if stamp != self._stamp:
            self._stamp = stamp
            self._skips = {_key(r): r for r in read_skips(self.path.parents[1])}


def _key(record: dict[str, Any]) -> Key:
    return record["topic"], int(record["queue_id"]), int(record["queue_offset"])


def read_skips(store_dir: Path) -> list[dict[str, Any]]:
    data = read_with_backup(Path(store_dir) / SKIP_FILE)
    return list(data["skipped"]) if data else []


def skip_unit(
    store_dir: Path, topic: str, queue_id: int, queue_offset: int, by: str, note: str = ""
) -> dict[str, Any]:
    """Record an operator's skip of a damaged unit; ValueError when there is no entry or
    the unit is not damaged (nothing would be gained, a good message would be lost)."""
    store_dir = Path(store_dir)
    files = inspection.segment_files(store_dir)
    log_min = int(files[0].name) if files else 0
    queues = inspection.read_consume_queues(store_dir / "consumequeue", log_min)
    entry = queues.get((topic, queue_id), {}).get(queue_offset)
    if entry is None:
        raise ValueError(f"{topic}/{queue_id} has no entry at queue offset {queue_offset}")
    phys, size, _tags = entry
    raw = _read_log(files, phys, size)
    reason = unit_damage(raw, phys) if len(raw) == size else f"only {len(raw)} bytes on disk"
    if reason is None:
        raise ValueError(f"{topic}/{queue_id}@{queue_offset} (log offset {phys}) is not damaged")
    record = {
        "topic": topic, "queue_id": queue_id, "queue_offset": queue_offset,
        "phys_offset": phys, "size": size, "reason": reason, "by": by, "note": note,
        "skipped_at": int(time.time() * 1000),
    }  # fmt: skip
    kept = [r for r in read_skips(store_dir) if _key(r) != _key(record)]
    write_atomic(store_dir / SKIP_FILE, {"skipped": [*kept, record]})
    return record


def _read_log(files: list[Path], phys: int, size: int) -> bytes:
    path = next((p for p in reversed(files) if int(p.name) <= phys), None)
    if path is None:
        return b""
    with open(path, "rb") as f:
        f.seek(phys - int(path.name))
        return f.read(size)
