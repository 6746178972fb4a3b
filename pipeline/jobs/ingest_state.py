"""Per-broker ingest checkpoints (the `ingest_checkpoint` Delta table) and run plans.

A run that has new log data first appends `planned` rows (its number and, per broker and
source, the offsets [start, plan_end) it will read), then writes the data tables, each
append carrying a Delta txn (`mqaudit-ingest`, run) so that it happens once, then appends
`done` rows with where the next run starts. A run found `planned` but not `done` (the job
died) is resumed with exactly its recorded ranges, so nothing is appended twice or skipped.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker_runtime.store.checkpoint import Checkpoint
from broker_runtime.store.message_store import LAYOUT_FILE
from pipeline.readers.commitlog import Broker
from pipeline.readers.store_files import consume_queues_end

COMMITLOG = "commitlog"
CONSUMEQUEUE = "consumequeue"
TXN_APP = "mqaudit-ingest"

Key = tuple[str, str, int, str]  # (cluster, broker, broker id, source)


def key(broker: Broker, source: str) -> Key:
    return (*broker.replica, source)


def row_key(row: dict[str, Any], source: str | None = None) -> Key:
    """The key of a checkpoint (or range summary) row; `source` when the row has none."""
    return (row["cluster"], row["broker"], int(row["broker_id"]), source or row["source"])


@dataclass(frozen=True)
class SourcePlan:
    broker: Broker
    source: str  # COMMITLOG or CONSUMEQUEUE
    start: int  # log offsets [start, plan_end)
    plan_end: int


@dataclass(frozen=True)
class RunPlan:
    run: int
    resumed: bool
    items: list[SourcePlan]

    def get(self, broker: Broker, source: str) -> SourcePlan | None:
        for item in self.items:
            if item.broker == broker and item.source == source:
                return item
        return None

    @property
    def has_work(self) -> bool:
        return any(i.start < i.plan_end for i in self.items)


@dataclass(frozen=True)
class State:
    """What the checkpoint table says: the last run, and where each broker/source goes on."""

    last_run: int
    unfinished: list[dict[str, Any]]  # the planned rows of the last run if it has no done rows
    # key -> (next offset, plan end) of its last done run
    next_offset: dict[Key, tuple[int, int]]


def load_state(rows: Iterable[dict[str, Any]]) -> State:
    rows = list(rows)
    last = max((int(r["run"]) for r in rows), default=0)
    done_runs = {int(r["run"]) for r in rows if r["status"] == "done"}
    unfinished = [r for r in rows if int(r["run"]) == last and last not in done_runs]
    next_offset: dict[Key, tuple[int, int]] = {}
    for r in sorted((r for r in rows if r["status"] == "done"), key=lambda r: int(r["run"])):
        next_offset[row_key(r)] = (int(r["next_offset"]), int(r["plan_end"]))
    return State(last, [r for r in unfinished if r["status"] == "planned"], next_offset)


def dispatch_bound(broker: Broker, plan_end: int) -> int:
    """How far the ConsumeQueues are surely built: all of the log after a clean stop, else
    (running or crashed broker) the offset mqaudit's checkpoint file says they reached, or in
    an Apache RocketMQ store (no config/storeLayout.json) where its queues end."""
    store = Path(broker.store_dir)
    if not (store / "abort").exists():
        return plan_end
    if not (store / LAYOUT_FILE).exists():  # Apache RocketMQ's: no such offset in its checkpoint
        return min(plan_end, consume_queues_end(broker.store_dir))
    cp = Checkpoint.load(store / "checkpoint")
    return min(plan_end, cp.logics_flushed_offset) if cp else 0


def resume_plan(state: State, brokers: list[Broker]) -> RunPlan:
    by_key = {b.replica: b for b in brokers}
    items = []
    for r in state.unfinished:
        broker = by_key.get(row_key(r)[:3])
        if broker is None:  # the broker's dir is gone: read it as recorded
            broker = Broker(r["broker"], int(r["broker_id"]), r["store_dir"], r["cluster"])
        items.append(SourcePlan(broker, r["source"], int(r["start_offset"]), int(r["plan_end"])))
    return RunPlan(state.last_run, True, items)


def rows_for(
    plan: RunPlan, status: str, results: dict[Key, dict[str, int]] | None = None
) -> list[dict[str, Any]]:
    """Checkpoint rows of the plan: `planned`, or `done` with each item's results
    (`next_offset`, `rows`, `quarantined`)."""
    now = int(time.time() * 1000)
    out = []
    for item in plan.items:
        res = (results or {}).get(key(item.broker, item.source), {})
        out.append(
            {
                "run": plan.run,
                "status": status,
                "broker": item.broker.name,
                "broker_id": item.broker.broker_id,
                "store_dir": item.broker.store_dir,
                "source": item.source,
                "start_offset": item.start,
                "plan_end": item.plan_end,
                "next_offset": res.get("next_offset", item.start),
                "rows": res.get("rows", 0),
                "quarantined": res.get("quarantined", 0),
                "created_at": now,
                "cluster": item.broker.cluster,
            }
        )
    return out
