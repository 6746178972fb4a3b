"""Consumer offset snapshots over time: `config/offsetHistory/<epoch ms>.json`.

`consumerOffset.json` holds the committed offsets now; an audit that reads it once sees one
point of each group's lag. A master with `offset_history_interval_ms` set also keeps a
snapshot per interval, each with the queues' min and max offsets at the same moment, so that
the audit can draw lag over time between its runs. Each file is written atomically; the
newest `keep` stay. The shape: `{"timestamp": ms, "offsetTable": {"topic@group": {"0": 33}},
"queueOffsets": {"topic": {"0": [min, max]}}}`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from broker_runtime.offsets.consumer_offsets import TOPIC_GROUP_SEPARATOR

HISTORY_DIR = Path("config") / "offsetHistory"
_SUFFIX = ".json"


@dataclass(frozen=True)
class OffsetHistoryEntry:
    timestamp: int  # epoch ms of the snapshot
    offsets: dict[str, dict[int, int]]  # "topic@group" -> queue id -> committed offset
    bounds: dict[tuple[str, int], tuple[int, int]]  # (topic, queue id) -> (min, max)


def history_dir(store_dir: Path | str) -> Path:
    return Path(store_dir) / HISTORY_DIR


def snapshot(
    timestamp: int,
    offsets: dict[str, dict[int, int]],
    bounds_of: Callable[[str, int], tuple[int, int]],
) -> OffsetHistoryEntry:
    """The entry for `offsets` at `timestamp`, each queue's bounds from `bounds_of`."""
    bounds: dict[tuple[str, int], tuple[int, int]] = {}
    for key, queues in offsets.items():
        topic = key.partition(TOPIC_GROUP_SEPARATOR)[0]
        for qid in queues:
            bounds[(topic, qid)] = bounds_of(topic, qid)
    return OffsetHistoryEntry(timestamp, offsets, bounds)


def write(store_dir: Path | str, entry: OffsetHistoryEntry, keep: int) -> Path:
    """Write `entry` (tmp file, fsync, rename) and remove all but the newest `keep`."""
    folder = history_dir(store_dir)
    folder.mkdir(parents=True, exist_ok=True)
    queues: dict[str, dict[str, list[int]]] = {}
    for (topic, qid), (lo, hi) in sorted(entry.bounds.items()):
        queues.setdefault(topic, {})[str(qid)] = [lo, hi]
    doc = {
        "timestamp": entry.timestamp,
        "offsetTable": {
            k: {str(q): o for q, o in sorted(v.items())} for k, v in sorted(entry.offsets.items())
        },
        "queueOffsets": queues,
    }
    path = folder / f"{entry.timestamp}{_SUFFIX}"
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    for old in _files(folder)[:-keep] if keep > 0 else []:
        old.unlink(missing_ok=True)
    return path


def _files(folder: Path) -> list[Path]:
    """The snapshot files, oldest first (by the time in the name)."""
    named = [p for p in folder.glob(f"*{_SUFFIX}") if p.stem.isdigit()]
    return sorted(named, key=lambda p: int(p.stem))


def read(store_dir: Path | str) -> Iterator[OffsetHistoryEntry | ValueError]:
    """Every snapshot, oldest first; an unreadable file is yielded as a ValueError naming it
    (the caller decides where it goes), never skipped silently."""
    folder = history_dir(store_dir)
    if not folder.is_dir():
        return
    for path in _files(folder):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            offsets = {
                str(k): {int(q): int(o) for q, o in v.items()}
                for k, v in doc["offsetTable"].items()
            }
            bounds = {
                (str(t), int(q)): (int(b[0]), int(b[1]))
                for t, qs in doc["queueOffsets"].items()
                for q, b in qs.items()
            }
            yield OffsetHistoryEntry(int(doc["timestamp"]), offsets, bounds)
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
            yield ValueError(f"{path}: {e}")
