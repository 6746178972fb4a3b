"""The workload's master-crash cluster (its scenario's own, under OUT/cluster/scenarios), which
the demo starts again for the loss repair: in the background while the other remedies run,
its nodes children of the demo's process, stopped by it after the repair (or on failure)."""

from __future__ import annotations

import contextlib
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from broker_runtime.cluster import supervisor
from broker_runtime.cluster.layout import ClusterLayout
from broker_runtime.workload.plan import MASTER_CRASH_ASYNC as LOSSY_CLUSTER

START_TIMEOUT_S = 120.0
STOP_GRACE_S = 10.0


class LossyCluster:
    def __init__(self, data_dir: Path) -> None:
        self.root = data_dir / "scenarios" / LOSSY_CLUSTER
        self._started: tuple[ClusterLayout, Future[None]] | None = None

    def exists(self) -> bool:
        return (self.root / "cluster.json").exists()

    def start(self) -> None:
        """Start its nodes in the background (once; none if the workload made no such cluster)."""
        if self._started is None and self.exists():
            layout, pool = ClusterLayout.load(self.root), ThreadPoolExecutor(1)
            self._started = (
                layout,
                pool.submit(supervisor.start_all, layout, None, START_TIMEOUT_S),
            )
            pool.shutdown(wait=False)

    def wait_ready(self) -> None:
        """Until every broker is on its name servers (start() first); its start's error if any."""
        if self._started is None:
            raise RuntimeError(f"the {LOSSY_CLUSTER} cluster was not started")
        self._started[1].result()

    def stop(self) -> None:
        """Stop it once its start has ended, if it was started."""
        if self._started is not None:
            (layout, started), self._started = self._started, None
            with contextlib.suppress(Exception):  # wait_ready reports a failed start
                started.result()
            supervisor.down(layout, STOP_GRACE_S)
