"""A small cluster data dir with known faults, for tests that run whole commands over it.

It is test_audit_pipeline's: broker-a's master store (U1 stored twice, U2 dead-lettered after
two retries), its slave copy, SQLite ledgers (L1 acknowledged but never stored) and
consumerOffset.json files dated SNAPSHOT_1 (group g2 has consumed nothing).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from broker_runtime.common.clock import FakeClock
from tests.integration.test_audit_pipeline import SNAPSHOT_1, T0, _write_ledgers, _write_store


def build_data_dir(root: Path) -> Path:
    """The cluster data dir under `root`; returns its path."""
    data_dir = root / "cluster"
    master = data_dir / "brokers" / "broker-a" / "master"
    clock = FakeClock(T0)
    placed = _write_store(master, clock)
    shutil.copytree(master, master.with_name("slave"))  # what replication gives the slave
    _write_ledgers(data_dir, clock, placed)
    for store in (master, master.with_name("slave")):
        offsets = store / "config" / "consumerOffset.json"
        os.utime(offsets, ns=(SNAPSHOT_1 * 1_000_000, SNAPSHOT_1 * 1_000_000))
    return data_dir
