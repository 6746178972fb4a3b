"""The audit job: the ingested tables of a lake -> its audit tables, each at LAKE/<name>.

Every run recomputes each audit table from all ingested data and overwrites it whole, in one
commit per table, stamped with the run's `as_of_ms`. Overwrite rather than merge because the
findings are a function of the whole lake: a duplicate found yesterday may be a resolved
retry today, and a merge by keys would keep the stale row. A table whose new rows equal its
current rows (same row count and sum of 64-bit row hashes) is not committed (the files of its
rows, written as they are counted and hashed, are discarded), so re-running the same as-of
over the same lake commits nothing; earlier runs stay readable through Delta's history.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from broker_runtime.common.constants import DEFAULT_MAX_SEND_COUNT, HALF_STUCK_AFTER_MS
from broker_runtime.common.progress import reporter
from pipeline import schemas
from pipeline.delta_files import Staged, parquet_files
from pipeline.delta_io import DeltaIO, table_exists
from pipeline.jobs.ingest_state import COMMITLOG
from pipeline.jobs.migrate import refuse_unkeyed
from pipeline.jobs.rabbit import TOPOLOGY, required_routes
from pipeline.lake import AUDIT_TABLES, DLQ_REPLAY_LOG, table_path
from pipeline.results import AuditResult, AuditTable
from pipeline.spark_session import apply_sql_conf, build_spark
from pipeline.transforms.audit_common import MESSAGE_COLUMNS, preferred_offsets, stored_copies
from pipeline.transforms.consistency import audit_consistency
from pipeline.transforms.dead_letters import audit_dead_letters
from pipeline.transforms.duplicates import audit_duplicates, repeated_deliveries
from pipeline.transforms.filter_audit import (
    audit_filters,
    expired_unreceived,
    group_expressions,
    not_selected,
)
from pipeline.transforms.lag import LagThresholds, audit_lag
from pipeline.transforms.losses import audit_losses
from pipeline.transforms.rabbit import (
    not_rabbitmq,
    rabbit_dead_letters,
    rabbit_duplicates,
    rabbit_losses,
)
from pipeline.transforms.resend import by_system, manual_handling, resend_candidates
from pipeline.transforms.transaction_audit import audit_transactions

_TOPIC = ["cluster", "broker", "topic"]  # a topic on one broker
# Audit tables computed at once. Each is the analysis of its plan, its Spark jobs and a
# commit, much of it the driver's serial work; two at a time keep both cores of a small
# machine busy (a warm audit of the demo's lake, one process: 10.0-13.1 s one at a time,
# 8.2-10.3 s two at a time, each table's plan built in its thread).
TABLES_AT_ONCE = 2


@dataclass(frozen=True)
class AuditThresholds:
    """The audit's tunables: lag status thresholds, the resend job's max send count, and how
    old a pending half message must be to be stuck."""

    lag: LagThresholds = field(default_factory=LagThresholds)
    max_send_count: int = DEFAULT_MAX_SEND_COUNT
    half_stuck_ms: int = HALF_STUCK_AFTER_MS

    def __post_init__(self) -> None:
        if self.max_send_count < 1:
            raise ValueError(f"max_send_count must be >= 1, got {self.max_send_count}")
        if self.half_stuck_ms < 0:
            raise ValueError(f"half_stuck_ms must be >= 0, got {self.half_stuck_ms}")


@dataclass
class _Inputs:
    messages: DataFrame
    consume_queue: DataFrame
    offsets: DataFrame  # consumer_offsets; after known_at, one replica's known at T
    stubs: DataFrame  # RocketMQ's rows of the ledgers
    log: DataFrame
    quarantine: DataFrame
    checkpoint: DataFrame
    replay_log: DataFrame
    ledger_stubs: DataFrame  # all of the ledgers' rows, RabbitMQ's among them
    ledger_log: DataFrame
    rabbit_routes: DataFrame  # the queues each RabbitMQ publish had to reach
    transactions: DataFrame
    filters: DataFrame  # consumer_filters
    filtered_messages: DataFrame  # `messages` with their properties, of the filtered topics
    # What several audit tables (or one, several times) derive from the above.
    copies: DataFrame  # stored_copies(messages)
    repeated: DataFrame  # repeated_deliveries(log), few rows: kept in memory

    def known_at(self, as_of_ms: int) -> _Inputs:
        """The inputs as an audit as of T sees them: the consumer offset snapshots known at
        T (a broker re-writes its consumerOffset.json every few seconds, and a later snapshot
        must not change the audit of an earlier interval), one replica's per broker group
        (preferred_offsets), chosen once and kept in memory for every audit table."""
        known = self.offsets.filter(F.col("snapshot_ts") <= as_of_ms)
        return replace(self, offsets=preferred_offsets(known).persist(StorageLevel.MEMORY_AND_DISK))

    def unpersist(self) -> None:
        for df in vars(self).values():
            df.unpersist()


def ingested_until(checkpoint: DataFrame) -> DataFrame:
    """Per broker (cluster, broker): when its commitlog was last planned for reading by a
    run that finished.

    Anything a broker acknowledged before then is in what that run read, if it was stored.
    """
    rows = checkpoint.filter(F.col("source") == COMMITLOG)
    done = rows.filter(F.col("status") == "done").select("run").distinct()
    planned = rows.filter(F.col("status") == "planned").join(done, on="run", how="inner")
    return planned.groupBy("cluster", "broker").agg(F.max("created_at").alias("ingested_to_ms"))


def default_as_of(inputs: _Inputs) -> int:
    """The lake's own clock: when it was last ingested, else its latest event time."""
    probes = [
        inputs.checkpoint.agg(F.max("created_at")),
        inputs.messages.agg(F.max("store_ts")),
        inputs.offsets.agg(F.max("snapshot_ts")),
        inputs.ledger_log.agg(F.max(F.greatest("received_at", "finished_at"))),
        inputs.ledger_stubs.agg(F.max("updated_at")),
    ]
    for probe in probes:
        value = probe.first()[0]  # type: ignore[index]
        if value is not None:
            return int(value)
    raise ValueError("the lake has no ingested data to audit (pass an explicit as-of time)")


def _replay_log(io: DeltaIO, lake: str) -> DataFrame:
    """The replay log; one written before `system` gains it first (null: rocketmq), once."""
    path = DLQ_REPLAY_LOG.path(lake)
    if table_exists(path):
        io.ensure_table(path, DLQ_REPLAY_LOG.schema)
    return io.read(path, DLQ_REPLAY_LOG.schema)


def _read_inputs(io: DeltaIO, lake: str) -> _Inputs:
    def read(name: str, schema: Any) -> DataFrame:
        return io.read(table_path(lake, name), schema)

    stored = read("messages", schemas.MESSAGES)  # one version for both views of it below
    messages = stored.select(*MESSAGE_COLUMNS)
    offsets = read("consumer_offsets", schemas.CONSUMER_OFFSETS)
    if "min_offset" not in offsets.columns:  # the queue's min offset, where ingest records it
        offsets = offsets.withColumn("min_offset", F.lit(None).cast("long"))
    # The small inputs feed several audit tables: each is read once and kept in memory. The
    # large ones (messages, the ledgers' rows, the stored copies) are scanned again by each
    # use, at the version read here: on a 4M-row lake, Spark's cache of the messages' columns
    # took 8.5 s to build against 2.4 s for a scan of them (1.6 s from the cache).
    keep = StorageLevel.MEMORY_AND_DISK
    stubs = read("message_stub", schemas.MESSAGE_STUB)
    log = read("message_log", schemas.MESSAGE_LOG)
    routes = required_routes(io.spark, stubs, read(TOPOLOGY.name, TOPOLOGY.schema))
    filters = read("consumer_filters", schemas.CONSUMER_FILTERS).persist(keep)
    log_rocketmq = not_rabbitmq(log)
    return _Inputs(
        messages=messages,
        consume_queue=read("consume_queue", schemas.CONSUME_QUEUE),
        offsets=offsets,  # chosen, and kept in memory, by known_at
        stubs=not_rabbitmq(stubs),
        log=log_rocketmq,
        quarantine=read("quarantine", schemas.QUARANTINE).persist(keep),
        checkpoint=read("ingest_checkpoint", schemas.INGEST_CHECKPOINT).persist(keep),
        replay_log=_replay_log(io, lake),
        ledger_stubs=stubs,
        ledger_log=log,
        rabbit_routes=routes.persist(keep),
        transactions=read("transactions", schemas.TRANSACTIONS),
        filters=filters,
        filtered_messages=stored.join(
            filters.select(*_TOPIC).distinct(), on=_TOPIC, how="left_semi"
        ),
        copies=stored_copies(messages),
        repeated=repeated_deliveries(log_rocketmq).persist(keep),
    )


def audit_tables(
    i: _Inputs, as_of_ms: int, thresholds: AuditThresholds
) -> dict[str, Callable[[], DataFrame]]:
    """Every audit table by name, as a function that builds its DataFrame (lazy) of the
    inputs `i`, which are `known_at(as_of_ms)`. Building one is Spark's analysis of a large
    plan (0.1-1 s on the driver): each table's is built where it is computed, beside the
    other tables being computed."""
    return {
        "audit_duplicates": lambda: audit_duplicates(
            i.messages, i.log, as_of_ms, copies=i.copies, repeated=i.repeated
        ).unionByName(rabbit_duplicates(i.ledger_log, as_of_ms)),
        "audit_losses": lambda: (
            audit_losses(
                i.messages,
                i.stubs,
                i.log,
                i.offsets,
                ingested_until(i.checkpoint),
                as_of_ms,
                group_expressions(i.filters, as_of_ms).select(
                    "group", "cluster", "broker", "topic"
                ),
                i.copies,
            )
            .unionByName(rabbit_losses(i.ledger_stubs, i.rabbit_routes, i.ledger_log, as_of_ms))
            .unionByName(
                expired_unreceived(i.filters, i.filtered_messages, i.log, i.offsets, as_of_ms)
            )
        ),
        "audit_lag": lambda: audit_lag(i.offsets, i.messages, thresholds.lag, as_of_ms),
        "audit_dead_letters": lambda: audit_dead_letters(
            i.messages, i.log, not_rabbitmq(i.replay_log), as_of_ms, i.copies
        ).unionByName(rabbit_dead_letters(i.ledger_log, as_of_ms, i.replay_log)),
        "resend_candidates": lambda: by_system(
            resend_candidates, i.ledger_stubs, i.ledger_log, thresholds.max_send_count, as_of_ms
        ),
        "manual_handling": lambda: by_system(
            manual_handling, i.ledger_stubs, i.ledger_log, thresholds.max_send_count, as_of_ms
        ),
        "consistency": lambda: audit_consistency(
            i.consume_queue, i.messages, i.offsets, i.quarantine, as_of_ms
        ),
        "audit_transactions": lambda: audit_transactions(
            i.transactions,
            i.messages,
            i.log,
            i.offsets,
            not_selected(i.filters, i.filtered_messages, as_of_ms),
            as_of_ms,
            thresholds.half_stuck_ms,
        ),
        "audit_filters": lambda: audit_filters(
            i.filters, i.filtered_messages, i.log, i.offsets, as_of_ms
        ),
    }


@dataclass(frozen=True)
class TableProfile:
    """What a run reports about a table, and a fingerprint of its rows as a multiset."""

    rows: int
    fingerprint: int
    kinds: dict[str, dict[str, int]]


def _fingerprint(columns: list[str]) -> Column:
    """The sum of the rows' 64-bit hashes: equal for equal multisets of rows."""
    return F.sum(F.xxhash64(*[F.col(c) for c in columns]).cast("decimal(38,0)"))


def _rows_and_fingerprint(df: DataFrame) -> tuple[int, int]:
    """A table's (rows, sum of row hashes): one Spark job."""
    (found,) = df.agg(F.count(F.lit(1)).alias("n"), _fingerprint(df.columns).alias("h")).collect()
    return int(found["n"]), int(found["h"] or 0)


def _staged_kinds(staged: Staged) -> dict[str, dict[str, int]]:
    """Rows per kind and cause of staged files (their two columns, read on the driver)."""
    files = parquet_files(staged.stage)
    if not files:
        return {}
    pairs = ds.dataset(files, format="parquet").to_table(columns=["kind", "cause"])
    counts = pairs.group_by(["kind", "cause"]).aggregate([([], "count_all")]).to_pylist()
    kinds: dict[str, dict[str, int]] = {}
    for r in counts:
        kinds.setdefault(r["kind"], {})[r["cause"]] = int(r["count_all"])
    return kinds


def write_if_changed(io: DeltaIO, df: DataFrame, path: str, name: str) -> tuple[TableProfile, bool]:
    """Overwrite the table unless it already holds the same rows; (profile, written).

    One Spark job computes the rows: Spark writes them as uncommitted files while observing
    their fingerprint; the files are committed if the table's rows differ, else discarded."""
    schema = AUDIT_TABLES[name]
    seen = Observation(f"audit-{name}")
    columns = schema.fieldNames()
    fingerprinted = df.select(*columns).observe(seen, _fingerprint(columns).alias("h"))
    staged = io.stage_files(fingerprinted, path, schema)
    new = TableProfile(staged.rows, int(seen.get["h"] or 0), _staged_kinds(staged))
    if table_exists(path):
        io.ensure_table(path, schema)  # a table of an older version gains the added columns
        if _rows_and_fingerprint(io.read(path, schema)) == (new.rows, new.fingerprint):
            staged.discard()
            return new, False
    io.commit_overwrite(staged, schema)
    return new, True


def _latest_lag_status(df: DataFrame) -> dict[str, int]:
    latest = df.groupBy("group", "topic", "cluster", "broker", "queue_id").agg(
        F.max_by("status", "snapshot_ts").alias("status")
    )
    return {r["status"]: int(r["count"]) for r in latest.groupBy("status").count().collect()}


def _audit_table(
    io: DeltaIO, build: Callable[[], DataFrame], root: str, name: str, say: Callable[[str], None]
) -> AuditTable:
    """Write one audit table (if its rows changed); its summary entry."""
    t0 = time.monotonic()
    df = build()
    if name == "audit_lag":  # also read for the latest statuses
        df = df.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        profile, written = write_if_changed(io, df, table_path(root, name), name)
        entry: AuditTable = {"rows": profile.rows, "written": written, "kinds": profile.kinds}
        if name == "audit_lag":
            entry["latest_status"] = _latest_lag_status(df)
    finally:
        df.unpersist()
    state = "written" if written else "unchanged"
    say(f"{name}: {profile.rows:,} rows, {state} ({time.monotonic() - t0:.1f} s)")
    return entry


def run_audit(
    lake: str | Path,
    spark: SparkSession | None = None,
    as_of_ms: int | None = None,
    thresholds: AuditThresholds | None = None,
    *,
    master: str | None = None,
    progress: bool = True,
    tables: Collection[str] | None = None,
) -> AuditResult:
    """Audit the lake at `as_of_ms` (default: its last ingest time); returns a summary.
    `tables`: only these audit tables (e.g. `audit_losses` after a repair); the rest stay."""
    started = time.monotonic()
    if not Path(lake).is_dir():
        raise ValueError(f"lake {lake} does not exist")
    unknown = sorted(set(tables or ()) - set(AUDIT_TABLES))
    if unknown:
        raise ValueError(f"no audit table(s) {unknown}; known: {sorted(AUDIT_TABLES)}")
    thresholds = thresholds or AuditThresholds()
    spark = spark or build_spark("mqaudit-audit", master)
    apply_sql_conf(spark)
    io = DeltaIO(spark)
    root = str(Path(lake).resolve())
    refuse_unkeyed(root)
    inputs = _read_inputs(io, root)
    try:
        as_of = default_as_of(inputs) if as_of_ms is None else int(as_of_ms)
        inputs = inputs.known_at(as_of)
        say = reporter("audit", progress)
        say(f"lake {root} as of {as_of} ({io.backend} Delta backend)")
        summary: AuditResult = {
            "lake": root,
            "as_of_ms": as_of,
            "backend": io.backend,
            "thresholds": asdict(thresholds),
            "tables": {},
            "seconds": 0.0,
        }
        todo = {
            name: build
            for name, build in audit_tables(inputs, as_of, thresholds).items()
            if tables is None or name in tables
        }
        with ThreadPoolExecutor(TABLES_AT_ONCE, thread_name_prefix="audit-table") as pool:
            done = {n: pool.submit(_audit_table, io, b, root, n, say) for n, b in todo.items()}
            try:
                summary["tables"] = {name: entry.result() for name, entry in done.items()}
            except BaseException:  # the tables not started yet stay as they are
                pool.shutdown(cancel_futures=True)
                raise
    finally:
        inputs.unpersist()
    summary["seconds"] = round(time.monotonic() - started, 3)
    return summary
