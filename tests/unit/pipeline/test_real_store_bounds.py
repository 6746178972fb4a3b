"""Ingest next to a running (or crashed) Apache RocketMQ broker: its checkpoint keeps only
timestamps (4.9) or offsets of another meaning (5.x) where mqaudit's keeps how far the
ConsumeQueues were flushed, so the bound of the ConsumeQueue ingest comes from the queues."""

from __future__ import annotations

import struct
from pathlib import Path

from broker_runtime.store.checkpoint import FILE_SIZE
from pipeline.jobs.ingest_state import dispatch_bound
from pipeline.readers.commitlog import Broker

ENTRY = struct.Struct(">qiq")


def _store(root: Path, queues: dict[tuple[str, int], list[tuple[int, int]]]) -> Broker:
    (root / "commitlog").mkdir(parents=True)
    for (topic, qid), entries in queues.items():
        qdir = root / "consumequeue" / topic / str(qid)
        qdir.mkdir(parents=True)
        raw = b"".join(ENTRY.pack(phys, size, 0) for phys, size in entries)
        (qdir / f"{0:020d}").write_bytes(raw + bytes(20 * 8))  # the rest of the file unwritten
    (root / "checkpoint").write_bytes(struct.pack(">qqq", 1, 1, 1) + bytes(FILE_SIZE - 24))
    (root / "abort").touch()  # running, or crashed
    return Broker("broker-r", 0, str(root))


def test_a_rocketmq_store_is_bounded_by_its_queues(tmp_path: Path) -> None:
    b = _store(
        tmp_path, {("T", 0): [(0, 100), (100, 50)], ("T", 1): [(150, 70)], ("U", 0): [(0, 0)]}
    )
    assert dispatch_bound(b, 1000) == 220  # before: 0, nothing ingested until it stopped
    assert dispatch_bound(b, 200) == 200
    (tmp_path / "abort").unlink()
    assert dispatch_bound(b, 1000) == 1000  # a clean stop: every entry is there


def test_an_mqaudit_store_keeps_its_checkpoint_bound(tmp_path: Path) -> None:
    b = _store(tmp_path, {("T", 0): [(0, 100)]})
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "storeLayout.json").write_text("{}")
    assert dispatch_bound(b, 1000) == 0  # its checkpoint's ConsumeQueue offset (@32) is 0
