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


def test_snapshots_over_time_show_the_lag_falling(tmp_path: Path) -> None:
    data = tmp_path / "cluster"
    settings = {"offset_history_interval_ms": "200", "offset_history_keep": "1000"}
    with running_cluster(data, name_servers=1, slaves=False, settings=settings) as cluster:
        ns = ["--namesrv", cluster.namesrv_addr]
        produce = mqaudit_cmd("produce", *ns, "--topic", TOPIC, "--count", str(COUNT))
        subprocess.run(produce, check=True, capture_output=True, timeout=120)
        consume = [*ns, "--group", GROUP, "--topic", TOPIC, "--from", "first"]
        # Two halves, so that a snapshot sees the group part of the way there.
        for _ in range(2):
            argv = mqaudit_cmd("consume", *consume, "--count", str(COUNT // 2), "--timeout", "30")
            subprocess.run(argv, check=True, capture_output=True, timeout=120)
        store = data / "brokers" / "broker-a" / "master"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # until a snapshot shows the group caught up
            entries = [e for e in offset_history.read(store) if not isinstance(e, ValueError)]
            if entries and f"{TOPIC}@{GROUP}" in entries[-1].offsets and _lag(entries[-1]) == 0:
                break
            time.sleep(0.2)
    entries = [e for e in offset_history.read(store)]
    assert all(isinstance(e, offset_history.OffsetHistoryEntry) for e in entries), entries
    mine = [e for e in entries if isinstance(e, offset_history.OffsetHistoryEntry)]
    lags = [_lag(e) for e in mine if f"{TOPIC}@{GROUP}" in e.offsets]
    assert lags and lags[-1] == 0, lags
    assert max(lags) > 0, lags  # seen behind at some snapshot, then caught up
    assert lags == sorted(lags, reverse=True), lags  # the group only catches up
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
    assert maxima[times[-1]] == COUNT
