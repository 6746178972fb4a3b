"""A real master keeps consumer offset snapshots over time while a group consumes: the
snapshots show the group's lag falling as it catches up, each with the queue's max offset
of its own moment, and the pipeline's reader gives them as snapshots of their own."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from broker_runtime.offsets import offset_history
from pipeline.readers.layout import discover_brokers
from pipeline.readers.store_files import offset_history as read_snapshots
from tests.conftest import mqaudit_cmd
from tests.integration.cluster_fixtures import running_cluster

pytestmark = [pytest.mark.integration]
TOPIC, GROUP, COUNT = "lagging", "slow-group", 300


def _lag(entry: offset_history.OffsetHistoryEntry) -> int:
    queues = entry.offsets.get(f"{TOPIC}@{GROUP}", {})
    return sum(entry.bounds[(TOPIC, q)][1] - o for q, o in queues.items())


def _wait_for_lag(store: Path, wanted: int) -> None:
    """Until the newest snapshot shows the group `wanted` messages behind."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        entries = [e for e in offset_history.read(store) if not isinstance(e, ValueError)]
        if entries and f"{TOPIC}@{GROUP}" in entries[-1].offsets and _lag(entries[-1]) == wanted:
            return
        time.sleep(0.2)
    raise AssertionError(f"no snapshot showed a lag of {wanted} within 30 s")


def test_snapshots_over_time_show_the_lag_falling(tmp_path: Path) -> None:
    data = tmp_path / "cluster"
    settings = {"offset_history_interval_ms": "200", "offset_history_keep": "1000"}
    with running_cluster(data, name_servers=1, slaves=False, settings=settings) as cluster:
        ns = ["--namesrv", cluster.namesrv_addr]
        produce = mqaudit_cmd("produce", *ns, "--topic", TOPIC, "--count", str(COUNT))
        consume = mqaudit_cmd(
            "consume", *ns, "--group", GROUP, "--topic", TOPIC, "--from", "first",
            "--count", str(COUNT), "--timeout", "30",
        )  # fmt: skip
        store = data / "brokers" / "broker-a" / "master"
        # The group consumes a first batch and is caught up; a second batch then puts it
        # COUNT behind (seen by a snapshot before it consumes again), and it catches up.
        for batch in (1, 2):
            subprocess.run(produce, check=True, capture_output=True, timeout=120)
            if batch == 2:
                _wait_for_lag(store, COUNT)
            subprocess.run(consume, check=True, capture_output=True, timeout=120)
            _wait_for_lag(store, 0)
    entries = [e for e in offset_history.read(store)]
    assert all(isinstance(e, offset_history.OffsetHistoryEntry) for e in entries), entries
    mine = [e for e in entries if isinstance(e, offset_history.OffsetHistoryEntry)]
    lags = [_lag(e) for e in mine if f"{TOPIC}@{GROUP}" in e.offsets]
    assert lags[-1] == 0 and COUNT in lags, lags
    after_peak = lags[lags.index(COUNT) :]
    assert after_peak == sorted(after_peak, reverse=True), lags  # it only catches up
    times = [e.timestamp for e in mine]
    assert times == sorted(times) and len(set(times)) == len(times)
    (master,) = [b for b in discover_brokers(data) if b.broker_id == 0]
    snapshots, errors = read_snapshots(master)
    assert errors == []
    assert [s.snapshot_ts for s in snapshots] == times
    maxima = {
        s.snapshot_ts: sum(r["max_offset"] for r in s.rows if r["topic"] == TOPIC)
        for s in snapshots
    }
    assert maxima[times[-1]] == 2 * COUNT
