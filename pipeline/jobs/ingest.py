"""Ingest cluster data dirs into one lake: messages, consume_queue, consumer_offsets,
consumer_filters, message_stub, message_log, quarantine and ingest_checkpoint, each at
LAKE/<table>, and `transactions`, derived from all of `messages` by each run that read
transactional units (counted as the workers decode them).

Incremental by a per-broker checkpoint of CommitLog offsets and idempotent (see
pipeline.jobs.ingest_state): a re-run with nothing new commits nothing. Every row names its
cluster (pipeline.schemas): several data dirs, each a cluster of its own, go into one lake.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from deltalake import DeltaTable
from pyspark.sql import SparkSession

from broker_runtime.common.progress import Ticker, reporter
from broker_runtime.offsets.json_file import CorruptStateError
from broker_runtime.offsets.offset_history import HISTORY_DIR
from pipeline import schemas
from pipeline.delta_io import DeltaIO, table_exists
from pipeline.jobs import ingest_state
from pipeline.jobs.ingest_sources import (
    Ledgers,
    check_names,
    find_brokers,
    find_ledgers,
    paths,
    quarantine_row,
)
from pipeline.jobs.ledger_ingest import merge_ledgers
from pipeline.jobs.maintenance import lake_lock
from pipeline.jobs.migrate import refuse_unkeyed
from pipeline.jobs.store_jobs import ByKey, Summaries, ingest_consume_queues, ingest_log
from pipeline.lake import INGESTED_TABLES, TABLES, table_path
from pipeline.readers.commitlog import DEFAULT_RANGE_BYTES, Broker, plan_log
from pipeline.readers.store_files import filter_snapshot, offset_history, offset_snapshot, plan_cq
from pipeline.results import IngestResult
from pipeline.spark_session import apply_sql_conf, build_spark
from pipeline.transforms.transactions import transactions_table


def run_ingest(
    data_dirs: str | Path | Sequence[str | Path] | None,
    lake: str | Path,
    spark: SparkSession | None = None,
    *,
    master: str | None = None,
    ledger_url: str | None = None,
    broker_name: str | None = None,
    cluster: str | None = None,
    broker_confs: Sequence[str | Path] = (),
    range_bytes: int = DEFAULT_RANGE_BYTES,
    progress: bool = True,
    allow_no_brokers: bool = False,
) -> IngestResult:
    """Ingest `data_dirs` (cluster data dirs or store dirs, one cluster each) and the store
    roots of the Apache RocketMQ brokers whose configs `broker_confs` names into `lake`; a
    summary. `ledger_url` holds the first data dir's ledgers (the others': their SQLite
    files); `cluster` names the cluster of a single data dir whose cluster.json names none.
    `allow_no_brokers` accepts a data dir without brokers (a RabbitMQ system's ledgers)."""
    started = time.monotonic()
    dirs = paths(data_dirs)
    check_names(dirs, cluster)
    brokers = find_brokers(dirs, broker_name, cluster, broker_confs, not allow_no_brokers)
    ledgers = find_ledgers(dirs, cluster, ledger_url, brokers)
    spark = spark or build_spark("mqaudit-ingest", master)
    apply_sql_conf(spark)
    job = _Ingest(spark, dirs, str(Path(lake).resolve()), progress)
    with lake_lock(lake):  # never beside a maintenance run's VACUUM
        return job.run(brokers, ledgers, range_bytes, started)


class _Ingest:
    def __init__(self, spark: SparkSession, dirs: list[Path], lake: str, progress: bool) -> None:
        self.spark = spark
        self.io = DeltaIO(spark)
        self.dirs = dirs
        self.lake = lake
        self.say = reporter("ingest", progress)
        self.warnings: list[str] = []
        self.quarantine: list[dict[str, Any]] = []
        self.results: dict[ingest_state.Key, dict[str, int]] = {}
        self.appended: dict[str, int] = {}
        self.readers: list[str] = []  # the decoders the workers loaded ("c", "python")

    def path(self, name: str) -> str:
        return table_path(self.lake, name)

    def run(
        self, brokers: list[Broker], ledgers: list[Ledgers], range_bytes: int, started: float
    ) -> IngestResult:
        where = ", ".join(map(str, self.dirs)) or "broker configs"
        clusters = ", ".join(sorted({b.cluster for b in brokers} | {x.cluster for x in ledgers}))
        self.say(
            f"{len(brokers)} broker store dir(s) ({where}) of cluster(s) {clusters}, "
            f"lake {self.lake} ({self.io.backend} Delta backend)",
        )
        refuse_unkeyed(self.lake)
        new = {t for t in INGESTED_TABLES if not table_exists(self.path(t))}
        for name in INGESTED_TABLES.keys() - new:  # an older version's: gains added columns
            self._ensure_table(name)
        # A new table is a commit (0.3 s in delta-spark): made while the CommitLog is read,
        # but for those the first writes make with their first commit.
        with ThreadPoolExecutor(4) as pool:
            made = [pool.submit(self._ensure_table, t) for t in new - _FIRST_WRITTEN]
            state = ingest_state.load_state(self._rows("ingest_checkpoint"))
            if state.unfinished:
                plan = ingest_state.resume_plan(state, brokers)
                self.say(f"resuming run {plan.run}, which did not finish")
            else:
                plan = self._new_plan(state, brokers, range_bytes)
            if plan.has_work and not plan.resumed:
                self._append_rows("ingest_checkpoint", ingest_state.rows_for(plan, "planned"))
            summaries = self._messages(plan, range_bytes)
        for f in made:
            f.result()
        self._consume_queues(plan)
        self._offsets(brokers, plan.run)
        self._filters(brokers, plan.run)
        self._ledgers(ledgers)
        self._quarantine(plan, summaries)
        if plan.has_work:
            self._transactions(plan.run, summaries)
            self._append_rows(
                "ingest_checkpoint", ingest_state.rows_for(plan, "done", self.results)
            )
        for name in new & _FIRST_WRITTEN:  # not written by this run (nothing to read)
            self._ensure_table(name)
        return self._summary(plan, started)

    # -- planning -------------------------------------------------------------------------

    def _new_plan(
        self, state: ingest_state.State, brokers: list[Broker], range_bytes: int
    ) -> ingest_state.RunPlan:
        items = []
        for b in brokers:
            key = ingest_state.key(b, ingest_state.COMMITLOG)
            start = state.next_offset.get(key, (0, -1))[0]
            log = plan_log(b, start, range_bytes)
            if start > log.data_end + 2 and log.data_end > 0:  # past a last unit's zero bytes
                self.warnings.append(
                    f"{b.cluster}/{b.name}/{b.broker_id}: the log ends at {log.data_end}, "
                    f"before the checkpoint {start} (log replaced?)"
                )
            if start < log.log_min:
                self.quarantine.append(
                    quarantine_row(
                        b,
                        "",
                        -1,
                        start,
                        log.log_min - start,
                        "expired",
                        "log files deleted before they were ingested",
                    )
                )
            end = log.plan_end
            if state.next_offset.get(key) == (log.start, end) or end < log.start:
                end = log.start  # only a known damaged tail, unchanged since: nothing new
            items.append(ingest_state.SourcePlan(b, ingest_state.COMMITLOG, log.start, end))
            cq_start = max(
                state.next_offset.get(ingest_state.key(b, ingest_state.CONSUMEQUEUE), (0, 0))[0],
                log.log_min,
            )
            # Entries point at messages the lake has or gets in this run, never further.
            cq_end = ingest_state.dispatch_bound(b, log.data_end)
            cq_end = max(cq_start, cq_end if end > log.start else min(cq_end, log.start))
            items.append(ingest_state.SourcePlan(b, ingest_state.CONSUMEQUEUE, cq_start, cq_end))
        return ingest_state.RunPlan(state.last_run + 1, False, items)

    # -- tables ---------------------------------------------------------------------------

    def _messages(self, plan: ingest_state.RunPlan, range_bytes: int) -> Summaries:
        items = [
            i for i in plan.items if i.source == ingest_state.COMMITLOG and i.start < i.plan_end
        ]
        tasks = [
            t for i in items for t in plan_log(i.broker, i.start, range_bytes, i.plan_end).tasks
        ]
        if not tasks:
            return {}
        total = sum(t.stop - t.start for t in tasks)
        self.say(
            f"run {plan.run}: {len(tasks)} ranges, {total / 1e6:,.1f} MB of CommitLog from "
            f"{len({t.path for t in tasks})} segment files",
        )
        acc = self.spark.sparkContext.accumulator({}, ByKey())

        def line() -> str:
            done = list(acc.value.values())
            return (
                f"{len(done)}/{len(tasks)} ranges, "
                f"{sum(d['bytes'] for d in done) / 1e6:,.1f}/{total / 1e6:,.1f} MB, "
                f"{sum(d['units'] for d in done):,} messages"
            )

        with Ticker(self.say, line):
            n = ingest_log(self.io, tasks, self.path("messages"), plan.run, acc)
        self.appended["messages"] = max(n, 0)
        summaries: Summaries = dict(acc.value)
        self.readers = sorted({s["reader"] for s in summaries.values()})
        self.say(line())
        for item in items:
            key = ingest_state.key(item.broker, ingest_state.COMMITLOG)
            mine = [
                s
                for s in summaries.values()
                if ingest_state.row_key(s, ingest_state.COMMITLOG) == key
            ]
            pending = [s["pending_from"] for s in mine if s["pending_from"] is not None]
            ends = [s["end"] for s in mine if s["end"] >= 0]
            nxt = min(pending) if pending else max(ends, default=item.start)
            self.results[key] = {
                "next_offset": nxt,
                "rows": sum(s["units"] for s in mine),
                "quarantined": sum(len(s["bad"]) for s in mine),
            }
        return summaries

    def _consume_queues(self, plan: ingest_state.RunPlan) -> None:
        files = []
        for item in (i for i in plan.items if i.source == ingest_state.CONSUMEQUEUE):
            b = item.broker
            # Entries only for messages the lake has: up to where the log was read.
            log = self.results.get(ingest_state.key(b, ingest_state.COMMITLOG))
            done = plan.get(b, ingest_state.COMMITLOG)
            hi = min(item.plan_end, log["next_offset"] if log else done.start if done else 0)
            self.results[ingest_state.key(b, ingest_state.CONSUMEQUEUE)] = {
                "next_offset": max(hi, item.start)
            }
            if hi > item.start:
                files += plan_cq(b, item.start, hi)
        if files:
            n = ingest_consume_queues(self.io, files, self.path("consume_queue"), plan.run)
            self.appended["consume_queue"] = max(n, 0)
            self.say(f"consume_queue: {max(n, 0):,} entries from {len(files)} files")

    def _offsets(self, brokers: list[Broker], run: int) -> None:
        have = {_snapshot(r) for r in self._rows("consumer_offsets")}
        rows = []
        for b in brokers:
            snaps, bad = offset_history(b)
            for e in bad:
                self.quarantine.append(
                    quarantine_row(b, str(HISTORY_DIR), 0, -1, 0, "bad_offsets_json", str(e))
                )
            try:
                snap = offset_snapshot(b)
            except CorruptStateError as e:
                self.quarantine.append(
                    quarantine_row(
                        b, "config/consumerOffset.json", 0, -1, 0, "bad_offsets_json", str(e)
                    )
                )
                snap = None
            # consumerOffset.json is dated by its last write, but its queues' bounds are read
            # now: where the history has a snapshot since that write, the file's snapshot
            # would put later bounds before it (a queue seen to shrink), and adds nothing.
            if snap is not None and any(s.snapshot_ts >= snap.snapshot_ts for s in snaps):
                snap = None
            for one in [*snaps, *([snap] if snap is not None else [])]:
                if (*b.replica, one.snapshot_ts) not in have:
                    have.add((*b.replica, one.snapshot_ts))
                    rows += [{**r, "ingest_run": run} for r in one.rows]
        if rows:
            self.appended["consumer_offsets"] = self._append_rows("consumer_offsets", rows)

    def _filters(self, brokers: list[Broker], run: int) -> None:
        """Each broker's consumerFilter.json, once per version of the file (its time)."""
        have = {_snapshot(r) for r in self._rows("consumer_filters")}
        rows = []
        for b in brokers:
            try:
                snap = filter_snapshot(b)
            except CorruptStateError as e:
                file = "config/consumerFilter.json"
                self.quarantine.append(
                    quarantine_row(b, file, 0, -1, 0, "bad_filters_json", str(e))
                )
                continue
            if snap is not None and (*b.replica, snap.snapshot_ts) not in have:
                rows += [{**r, "ingest_run": run} for r in snap.rows]
        if rows:
            self.appended["consumer_filters"] = self._append_rows("consumer_filters", rows)

    def _ledgers(self, ledgers: list[Ledgers]) -> None:
        merged = merge_ledgers(self.spark, self.io, self.lake, ledgers, self.say)
        self.appended |= {name: max(n, 0) for name, n in merged.items()}

    def _quarantine(self, plan: ingest_state.RunPlan, summaries: Summaries) -> None:
        for s in summaries.values():
            b = Broker(s["broker"], s["broker_id"], "", s["cluster"])
            for bad in s["bad"]:  # the fields of a BadRange, as quarantine_row names them
                self.quarantine.append(quarantine_row(b, s["file"], **bad))
        walked = {_replica(s) for s in summaries.values()}
        if not self.quarantine and not walked:
            return
        old = {_quarantine_key(r): r for r in self._rows("quarantine")}
        new = {}
        for q in self.quarantine:
            key = _quarantine_key(q)
            new[key] = {**q, "first_run": old[key]["first_run"] if key in old else plan.run}
        # Damaged tails of walked brokers that are not there any more are gone from the table.
        kept = {
            k: r
            for k, r in old.items()
            if k not in new and (r["final"] or _replica(r) not in walked)
        }
        changed = [r for k, r in new.items() if old.get(k) != r]
        if changed or len(kept) + len(new) != len(old):
            rows = sorted([*kept.values(), *new.values()], key=_quarantine_key)
            self.io.replace_rows(rows, self.path("quarantine"), schemas.QUARANTINE)
        self.appended["quarantine"] = len(changed)

    def _transactions(self, run: int, summaries: Summaries) -> None:
        """Rebuild `transactions` whole from all of `messages` (a transaction's units span
        runs) if this run read transactional units, or the table, new in a lake with earlier
        runs, was never built. Otherwise it holds what a rebuild would give (but `ingest_run`)."""
        path = self.path("transactions")
        units = sum(s["transaction_units"] for s in summaries.values())
        if not units and (run == 1 or DeltaTable(path).version() > 0):
            self.appended["transactions"] = 0
            return
        rows = transactions_table(self.io.read(self.path("messages"), schemas.MESSAGES), run)
        self.appended["transactions"] = self.io.overwrite(rows, path, schemas.TRANSACTIONS)

    # -- helpers --------------------------------------------------------------------------

    def _ensure_table(self, name: str) -> None:
        self.io.ensure_table(self.path(name), INGESTED_TABLES[name], TABLES[name].partitions)

    def _append_rows(self, table: str, rows: list[dict[str, Any]]) -> int:
        return self.io.append_rows(rows, self.path(table), TABLES[table].schema)

    def _rows(self, table: str) -> list[dict[str, Any]]:
        """A small table's rows (read on the driver)."""
        return list(self.io.read_small(self.path(table), TABLES[table].schema).to_pylist())

    def _summary(self, plan: ingest_state.RunPlan, started: float) -> IngestResult:
        seconds = time.monotonic() - started
        messages = sum(
            r.get("rows", 0) for k, r in self.results.items() if k[3] == ingest_state.COMMITLOG
        )
        reasons: dict[str, int] = {}
        for q in self.quarantine:
            reasons[q["reason"]] = reasons.get(q["reason"], 0) + 1
        return {
            "run": plan.run if plan.has_work else None,
            "resumed": plan.resumed,
            "backend": self.io.backend,
            "lake": self.lake,
            "brokers": [
                {
                    "cluster": i.broker.cluster,
                    "broker": i.broker.name,
                    "broker_id": i.broker.broker_id,
                    "source": i.source,
                    "start": i.start,
                    "plan_end": i.plan_end,
                    **self.results.get(ingest_state.key(i.broker, i.source), {}),
                }
                for i in plan.items
            ],
            "messages": messages,
            "readers": self.readers,
            "appended": self.appended,
            "quarantine": reasons,
            "warnings": self.warnings,
            "seconds": round(seconds, 3),
        }


# Tables whose first append (before the others' are needed) makes them.
_FIRST_WRITTEN = {"ingest_checkpoint", "messages"}


def _replica(row: dict[str, Any]) -> tuple[str, str, int]:
    return (row["cluster"], row["broker"], row["broker_id"])


def _snapshot(row: dict[str, Any]) -> tuple[str, str, int, int]:
    return (*_replica(row), row["snapshot_ts"])


def _quarantine_key(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(row[k] for k in TABLES["quarantine"].key)
