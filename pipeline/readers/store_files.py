"""ConsumeQueue files, consumer offset and consumer filter snapshots of a store dir -> Arrow /
rows.

Read-only, like broker_runtime.store.inspection: safe next to a running broker.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from broker_runtime.offsets import offset_history as offset_history_files
from broker_runtime.offsets.consumer_filters import consumer_filter_path, read_consumer_filters
from broker_runtime.offsets.consumer_offsets import TOPIC_GROUP_SEPARATOR, ConsumerOffsets
from broker_runtime.offsets.json_file import CorruptStateError
from broker_runtime.store.consume_queue import ENTRY_SIZE
from broker_runtime.store.mapped_file import NAME_DIGITS
from pipeline.readers.commitlog import Broker, segment_files
from pipeline.schemas import CONSUME_QUEUE, arrow_schema

CQ_DTYPE = np.dtype([("phys", ">i8"), ("size", ">i4"), ("tags", ">i8")])
assert CQ_DTYPE.itemsize == ENTRY_SIZE
_BLANK_SIZE = 0x7FFFFFFF  # RocketMQ's filler entry for a queue offset without a message
_CQ_ARROW = arrow_schema(CONSUME_QUEUE)


@dataclass(frozen=True)
class CqFile:
    cluster: str
    broker: str
    broker_id: int
    topic: str
    queue_id: int
    path: str
    lo: int  # entries whose log offset is in [lo, hi)
    hi: int

    def as_row(self) -> dict[str, Any]:
        return asdict(self)


def queue_dirs(store_dir: str) -> list[tuple[str, int, Path]]:
    root = Path(store_dir) / "consumequeue"
    if not root.is_dir():
        return []
    return [
        (q.parent.name, int(q.name), q)
        for q in sorted(root.glob("*/*"))
        if q.is_dir() and q.name.isdigit()
    ]


def _files(qdir: Path) -> list[Path]:
    return sorted(p for p in qdir.iterdir() if p.name.isdigit() and len(p.name) == NAME_DIGITS)


def plan_cq(broker: Broker, lo: int, hi: int) -> list[CqFile]:
    """Every ConsumeQueue file of the broker, to be read for entries pointing into [lo, hi)."""
    return [
        CqFile(broker.cluster, broker.name, broker.broker_id, topic, qid, str(path), lo, hi)
        for topic, qid, qdir in queue_dirs(broker.store_dir)
        for path in _files(qdir)
    ]


def _entries(path: str) -> np.ndarray[Any, np.dtype[np.void]]:
    with open(path, "rb") as f:
        raw = f.read()
    usable = len(raw) - len(raw) % ENTRY_SIZE
    return np.frombuffer(raw, dtype=CQ_DTYPE, count=usable // ENTRY_SIZE)


def read_cq_file(task: CqFile, run: int) -> pa.RecordBatch:
    """CONSUME_QUEUE rows of the file's written entries that point into [lo, hi)."""
    e = _entries(task.path)
    base = int(Path(task.path).name) // ENTRY_SIZE
    phys = e["phys"].astype(np.int64)
    size = e["size"].astype(np.int32)
    keep = np.flatnonzero(
        (size != 0) & (size != _BLANK_SIZE) & (phys >= task.lo) & (phys < task.hi)
    )
    n = len(keep)
    columns = [
        pa.array([task.broker] * n, pa.string()),
        pa.array(np.full(n, task.broker_id, dtype=np.int32)),
        pa.array([task.topic] * n, pa.string()),
        pa.array(np.full(n, task.queue_id, dtype=np.int32)),
        pa.array(keep.astype(np.int64) + base),
        pa.array(phys[keep]),
        pa.array(size[keep]),
        pa.array(e["tags"][keep].astype(np.int64)),
        pa.array(np.full(n, run, dtype=np.int64)),
        pa.repeat(pa.scalar(task.cluster, pa.string()), n),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=_CQ_ARROW)


def queue_bounds(store_dir: str) -> dict[tuple[str, int], tuple[int, int]]:
    """(topic, queue id) -> (min offset, max offset) as the broker reports them.

    Max (getMaxOffsetInQueue): the next queue offset to be written. Min (getMinOffsetInQueue):
    the first entry of the queue's first file that is written, not a filler and points into
    the log (older log files may have expired while the queue file stayed), or the next file's
    first such entry, or the max offset when the queue has none.
    """
    logs = segment_files(store_dir)
    log_min = int(logs[0].name) if logs else 0
    out = {}
    for topic, qid, qdir in queue_dirs(store_dir):
        files = _files(qdir)
        hi = int(files[0].name) // ENTRY_SIZE if files else 0
        for path in reversed(files):
            written = np.flatnonzero(_entries(str(path))["size"] != 0)
            if len(written):
                hi = int(path.name) // ENTRY_SIZE + int(written[-1]) + 1
                break
        lo = hi
        for path in files:
            e = _entries(str(path))
            size = e["size"].astype(np.int64)
            valid = (size != 0) & (size != _BLANK_SIZE) & (e["phys"].astype(np.int64) >= log_min)
            first = np.flatnonzero(valid)
            if len(first):
                lo = min(hi, int(path.name) // ENTRY_SIZE + int(first[0]))
                break
        out[(topic, qid)] = (lo, hi)
    return out


def consume_queues_end(store_dir: str) -> int:
    """Where the ConsumeQueues reach in the log: the end (offset + size) of the furthest last
    entry of any queue, as Apache RocketMQ's recovery takes it (maxPhyOffsetOfConsumeQueue).
    Its dispatcher writes entries in log order, so every message before that has its entry."""
    end = 0
    for _topic, _qid, qdir in queue_dirs(store_dir):
        for path in reversed(_files(qdir)):
            e = _entries(str(path))
            size = e["size"].astype(np.int64)
            written = np.flatnonzero((size != 0) & (size != _BLANK_SIZE))
            if len(written):
                last = int(written[-1])
                end = max(end, int(e["phys"][last]) + int(size[last]))
                break
    return end


@dataclass(frozen=True)
class OffsetSnapshot:
    snapshot_ts: int  # consumerOffset.json's modification time, epoch ms
    rows: list[dict[str, Any]]


def _snapshot_rows(
    broker: Broker,
    snapshot_ts: int,
    table: dict[str, dict[int, int]],
    bounds: dict[tuple[str, int], tuple[int, int]],
) -> list[dict[str, Any]]:
    rows = []
    for key, queues in sorted(table.items()):
        topic, _, group = key.partition(TOPIC_GROUP_SEPARATOR)
        for qid, offset in sorted(queues.items()):
            lo, hi = bounds.get((topic, qid), (0, 0))
            rows.append(
                {
                    "cluster": broker.cluster,
                    "broker": broker.name,
                    "broker_id": broker.broker_id,
                    "snapshot_ts": snapshot_ts,
                    "topic": topic,
                    "consumer_group": group,
                    "queue_id": qid,
                    "committed_offset": offset,
                    "max_offset": hi,
                    "min_offset": lo,
                }
            )
    return rows


def offset_snapshot(broker: Broker) -> OffsetSnapshot | None:
    """The broker's committed offsets now, each with its queue's min and max offsets.

    None when the broker has no consumerOffset.json; raises CorruptStateError when neither
    it nor its .bak can be read.
    """
    path = Path(broker.store_dir) / "config" / "consumerOffset.json"
    source = path if path.exists() else path.with_name(path.name + ".bak")
    if not source.exists():
        return None
    snapshot_ts = os.stat(source).st_mtime_ns // 1_000_000
    try:
        table = ConsumerOffsets(Path(broker.store_dir)).table()
    except (CorruptStateError, ValueError) as e:
        raise CorruptStateError(f"{source}: {e}") from e
    bounds = queue_bounds(broker.store_dir)
    return OffsetSnapshot(snapshot_ts, _snapshot_rows(broker, snapshot_ts, table, bounds))


def offset_history(broker: Broker) -> tuple[list[OffsetSnapshot], list[ValueError]]:
    """The snapshots a master kept over time (config/offsetHistory), each with the queues'
    bounds of its moment; and the files that could not be read."""
    snapshots, errors = [], []
    for entry in offset_history_files.read(broker.store_dir):
        if isinstance(entry, ValueError):
            errors.append(entry)
            continue
        rows = _snapshot_rows(broker, entry.timestamp, entry.offsets, entry.bounds)
        snapshots.append(OffsetSnapshot(entry.timestamp, rows))
    return snapshots, errors


def filter_snapshot(broker: Broker) -> OffsetSnapshot | None:
    """The broker's consumerFilter.json as `consumer_filters` rows, dated by the file's time;
    None without the file; CorruptStateError when neither it nor its .bak can be read."""
    path = consumer_filter_path(broker.store_dir)
    source = path if path.exists() else path.with_name(path.name + ".bak")
    if not source.exists():
        return None
    snapshot_ts = os.stat(source).st_mtime_ns // 1_000_000
    rows = [
        {
            "cluster": broker.cluster,
            "broker": broker.name,
            "broker_id": broker.broker_id,
            "snapshot_ts": snapshot_ts,
            "topic": e.topic,
            "consumer_group": e.consumer_group,
            "expression_type": e.expression_type,
            "expression": e.expression,
            "client_version": e.client_version,
            "born_ts": e.born_time,
            "dead_ts": e.dead_time if e.dead else None,
        }
        for e in read_consumer_filters(broker.store_dir)
    ]
    return OffsetSnapshot(snapshot_ts, rows)
