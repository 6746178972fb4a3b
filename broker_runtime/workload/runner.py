"""Run the planned scenarios, in lanes side by side, and write truth.json.

Scenarios that need the cluster configured otherwise (replication and flush modes, the
queue access lock) start their own cluster under DIR/scenarios/<name>/ and take it down
at the end (its files stay); the others run on the cluster in DIR. Scenarios run in lanes
(`lanes`), side by side. A scenario that fails is recorded as failed and the run goes on:
truth.json then holds the scenarios that completed, and the failures (the exit code is 1).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker_runtime.cluster.layout import ClusterLayout
from broker_runtime.common.progress import reporter
from broker_runtime.workload import plan as P
from broker_runtime.workload.harness import Harness, WorkloadError
from broker_runtime.workload.scenarios.common import Ctx
from broker_runtime.workload.scenarios.failures import consumer_failures, producer_resend
from broker_runtime.workload.scenarios.master_crash import (
    ASYNC_SETTINGS,
    master_crash_async,
    master_crash_sync,
)
from broker_runtime.workload.scenarios.rebalance import (
    namesrv_split,
    rebalance_lock_off,
    rebalance_lock_on,
)
from broker_runtime.workload.scenarios.redelivery import ack_lost, consumer_crash_unacked
from broker_runtime.workload.scenarios.transactions import BROKER_SETTINGS as TX_SETTINGS
from broker_runtime.workload.scenarios.transactions import transactions
from broker_runtime.workload.truth import summary, validate

Runner = Callable[[Ctx], Awaitable[dict[str, Any]]]

ON_MAIN_CLUSTER: dict[str, Runner] = {
    P.CONSUMER_CRASH: consumer_crash_unacked,
    P.ACK_LOST: ack_lost,
    P.PRODUCER_RESEND: producer_resend,
    P.NAMESRV_SPLIT: namesrv_split,
    P.CONSUMER_FAILURES: consumer_failures,
}
# The main cluster's scenarios in two lanes of about the same length (each scenario has a
# topic and groups of its own; most of their time is spent waiting on consumer processes).
MAIN_LANE: dict[str, str] = {
    P.CONSUMER_CRASH: "main-1",
    P.ACK_LOST: "main-1",
    P.NAMESRV_SPLIT: "main-1",
    P.PRODUCER_RESEND: "main-2",
    P.CONSUMER_FAILURES: "main-2",
}


@dataclass(frozen=True)
class OwnCluster:
    """A scenario on a cluster of its own: its ClusterSettings (`mqaudit cluster up`)."""

    runner: Runner
    cluster: dict[str, Any]


_SMALL: dict[str, Any] = {"name_servers": 1, "groups": ("broker-a",), "segment_size": 64 << 20}


def _rebalance(lock: bool) -> dict[str, Any]:
    lock_settings = {"queue_access_lock": str(lock).lower(), "queue_lock_hold_timeout_ms": "10000"}
    return {**_SMALL, "slaves": False, "broker_settings": lock_settings}


def _crash(mode: str) -> dict[str, Any]:
    broker = ASYNC_SETTINGS if mode == "async" else {}
    return {**_SMALL, "flush": mode, "replication": mode, "broker_settings": broker}


# In the order their clusters start, two at a time (ClusterStarter): the two rebalances
# together, then the longest of the others first.
ON_OWN_CLUSTER: dict[str, OwnCluster] = {
    P.REBALANCE_LOCK_OFF: OwnCluster(rebalance_lock_off, _rebalance(False)),
    P.REBALANCE_LOCK_ON: OwnCluster(rebalance_lock_on, _rebalance(True)),
    P.TRANSACTIONS: OwnCluster(
        transactions, {**_SMALL, "slaves": False, "broker_settings": TX_SETTINGS}
    ),
    P.MASTER_CRASH_ASYNC: OwnCluster(master_crash_async, _crash("async")),
    P.MASTER_CRASH_SYNC: OwnCluster(master_crash_sync, _crash("sync")),
}


def lanes(plans: list[P.ScenarioPlan]) -> list[list[P.ScenarioPlan]]:
    """Scenarios that run one after another: the main cluster's, in two lanes; each one on
    a cluster of its own alone. The lanes run side by side: the two rebalances too, so that
    the lock on and off are compared on the same workload under the same machine load."""
    out: dict[str, list[P.ScenarioPlan]] = {}
    for p in plans:
        out.setdefault(MAIN_LANE.get(p.name, p.name), []).append(p)
    return list(out.values())


class ClusterStarter:
    """Starts the scenarios' own clusters on background threads (in ON_OWN_CLUSTER's
    order; each scenario is a lane of its own), and takes them down the same way."""

    def __init__(self, h: Harness, plans: list[P.ScenarioPlan]) -> None:
        self.h = h
        self.pool = ThreadPoolExecutor(2, "clusters")
        self.started: dict[str, concurrent.futures.Future[ClusterLayout]] = {}
        planned = {p.name for p in plans}
        for n, own in ON_OWN_CLUSTER.items():
            if n in planned:
                self.started[n] = self.pool.submit(h.cluster_up, n, **own.cluster)
        self._down: set[str] = set()

    async def layout(self, name: str) -> ClusterLayout:
        return await asyncio.wrap_future(self.started[name])

    def down(self, name: str) -> None:
        f = self.started[name]
        if name in self._down or not f.done() or f.exception() is not None:
            return
        self._down.add(name)
        self.pool.submit(self.h.cluster_down, Path(f.result().data_dir))

    def close(self) -> None:
        """Take down what is still up (a run that stopped early), wait for every stop."""
        for f in self.started.values():
            f.cancel()  # not started yet: never will be
        for name, f in self.started.items():
            if not f.cancelled():
                concurrent.futures.wait([f])
                self.down(name)
        self.pool.shutdown(wait=True)


_T0 = time.monotonic()
_say = reporter("workload")


def say(msg: str) -> None:
    _say(f"[{time.monotonic() - _T0:6.1f}s] {msg}")


def write_truth(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)


async def run(
    data_dir: Path,
    messages: int,
    scenario: str,
    truth_path: Path,
    seed: int,
    ledger_url: str | None = None,
) -> tuple[dict[str, Any], bool]:
    """Returns the summary and whether every scenario completed."""
    plans = P.plan_run(seed, messages, scenario)
    run_id = f"s{seed}-{time.strftime('%m%d%H%M%S')}"
    h = Harness(data_dir, run_id, ledger_url, say)
    layout = h.main_layout()
    doc: dict[str, Any] = {
        "seed": seed,
        "messages": messages,
        "run_id": run_id,
        "data_dir": str(h.data_dir),
        "started_at": time.time_ns() // 1_000_000,
        "scenarios": {},
    }
    say(f"run {run_id}: {len(plans)} scenario(s), {messages} messages, seed {seed}")
    entries: dict[str, dict[str, Any]] = {}
    failures: list[dict[str, str]] = []
    seconds: dict[str, float] = {}  # per scenario, from its start (its cluster's wait included)
    starter = ClusterStarter(h, plans)

    async def one(p: P.ScenarioPlan) -> None:
        started = time.monotonic()
        say(f"{p.name}: {p.messages} messages, {json.dumps(p.params)[:160]}")
        if p.name in ON_OWN_CLUSTER:
            own = await starter.layout(p.name)
            waited = time.monotonic() - started
            if waited >= 1:
                say(f"{p.name}: its cluster is up after {waited:.1f} s")
            ctx = Ctx(h, p, Path(own.data_dir), own.namesrv_addr)
            entries[p.name] = await ON_OWN_CLUSTER[p.name].runner(ctx)
            starter.down(p.name)
        else:
            ctx = Ctx(h, p, h.data_dir, layout.namesrv_addr)
            entries[p.name] = await ON_MAIN_CLUSTER[p.name](ctx)
        found = {k: v for k, v in entries[p.name]["expected"].items() if v}
        seconds[p.name] = round(time.monotonic() - started, 1)
        entries[p.name]["stats"]["seconds"] = seconds[p.name]
        say(f"{p.name}: done in {seconds[p.name]} s: {found}")

    async def lane(lane_plans: list[P.ScenarioPlan]) -> None:
        """Scenarios one after another; one that fails is recorded, and the next starts."""
        for p in lane_plans:
            try:
                await one(p)
            except (WorkloadError, OSError, TimeoutError) as e:
                failures.append({"scenario": p.name, "error": str(e)})
                say(f"{p.name} FAILED: {e}")
                h.cleanup(p.name)  # its consumers, if still running

    try:
        await asyncio.gather(*(lane(ps) for ps in lanes(plans)))
    finally:
        h.cleanup()
        starter.close()
        doc["scenarios"] = {p.name: entries[p.name] for p in plans if p.name in entries}
        if failures:
            doc["failed"] = failures
        doc["finished_at"] = time.time_ns() // 1_000_000
        validate(doc)
        write_truth(truth_path, doc)
    say(f"truth written to {truth_path}")
    out = summary(doc)
    out["scenario_seconds"] = seconds
    dups = out.get("rebalance_duplicate_deliveries", {})
    if dups:
        say(f"rebalance duplicate deliveries: {', '.join(f'{k} {v}' for k, v in dups.items())}")
    if failures:
        out["failed"] = failures
    return out, not failures
