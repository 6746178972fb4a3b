"""Consumer offset snapshots over time: written atomically, pruned to the newest, read back
in time order; a damaged file is reported by name, never skipped silently."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_runtime.offsets import offset_history
from pipeline.readers.commitlog import Broker
from pipeline.readers.store_files import offset_history as read_snapshots


def _entry(ts: int, committed: int, max_offset: int) -> offset_history.OffsetHistoryEntry:
    return offset_history.snapshot(
        ts, {"orders@pay": {0: committed, 1: 0}}, lambda topic, qid: (0, max_offset + qid)
    )


def test_written_pruned_and_read_in_time_order(tmp_path: Path) -> None:
    for ts, committed in ((3_000, 30), (1_000, 10), (2_000, 20), (4_000, 40)):
        offset_history.write(tmp_path, _entry(ts, committed, 50), keep=3)
    entries = list(offset_history.read(tmp_path))
    assert [e.timestamp for e in entries] == [2_000, 3_000, 4_000]  # type: ignore[union-attr]
    last = entries[-1]
    assert isinstance(last, offset_history.OffsetHistoryEntry)
    assert last.offsets == {"orders@pay": {0: 40, 1: 0}}
    assert last.bounds == {("orders", 0): (0, 50), ("orders", 1): (0, 51)}
    assert not list(offset_history.history_dir(tmp_path).glob("*.tmp"))


def test_the_reader_gives_one_snapshot_per_file_and_names_a_bad_one(tmp_path: Path) -> None:
    offset_history.write(tmp_path, _entry(1_000, 5, 9), keep=10)
    offset_history.write(tmp_path, _entry(2_000, 9, 9), keep=10)
    (offset_history.history_dir(tmp_path) / "1500.json").write_text('{"timestamp": 1500')
    broker = Broker("broker-a", 0, str(tmp_path))
    snapshots, errors = read_snapshots(broker)
    assert [s.snapshot_ts for s in snapshots] == [1_000, 2_000]
    rows = {(s.snapshot_ts, r["queue_id"]): r for s in snapshots for r in s.rows}
    assert rows[(1_000, 0)]["committed_offset"] == 5 and rows[(1_000, 0)]["max_offset"] == 9
    assert rows[(2_000, 1)]["max_offset"] == 10 and rows[(2_000, 1)]["consumer_group"] == "pay"
    (error,) = errors
    assert "1500.json" in str(error)


def test_bad_settings_are_refused() -> None:
    from broker_runtime.common.config import BrokerConfig, StoreConfig

    store = StoreConfig(store_dir=Path("/nonexistent"))
    with pytest.raises(ValueError, match="offset_history_interval_ms"):
        BrokerConfig(store=store, offset_history_interval_ms=-1)
    with pytest.raises(ValueError, match="offset_history_keep"):
        BrokerConfig(store=store, offset_history_keep=0)
