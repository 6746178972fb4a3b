"""The DLQ replay job: dead letters from the lake back to their original topics, safely.

Three steps, run by the replay DAG as tasks or by `mqaudit pipeline replay` in one go:
`plan_step` (match dead letters, settle earlier runs' unknown outcomes against the broker,
log the plan), `send_step` (send what the plan still has pending at the asked rate, log each
outcome; on resume settle this replay's own unknown outcomes first) and `replay_summary`.
Every event lands in the Delta table `dlq_replay_log` (see pipeline.remediation.replay_plan).
Runnable as `python -m pipeline.jobs.replay ...` (spark-submit) with the CLI's options.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from broker_runtime.common.progress import reporter
from pipeline import schemas
from pipeline.delta_io import DeltaIO
from pipeline.lake import DLQ_REPLAY_LOG, table_path
from pipeline.remediation.outcome_log import OutcomeLog
from pipeline.remediation.replay_plan import (
    REPLAY_ID_PROPERTY,
    DeadLetter,
    LogEntry,
    Status,
    in_doubt,
    pending,
    plan_replay,
    replay_message,
    where_they_stand,
)
from pipeline.remediation.replay_request import ReplayRequest
from pipeline.remediation.sender import BrokerClient, BrokerTarget
from pipeline.remediation.sends import Stored, reconcile, send_all
from pipeline.spark_session import apply_sql_conf, build_spark


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _session(spark: SparkSession | None, master: str | None) -> SparkSession:
    spark = spark or build_spark("mqaudit-replay", master)
    apply_sql_conf(spark)
    return spark


# -- reading the lake ---------------------------------------------------------------------


def dead_letters_df(
    io: DeltaIO,
    lake: str,
    request: ReplayRequest,
    ids: Sequence[str] | None = None,
    with_body: bool = False,
) -> DataFrame:
    """Per message, the earliest DLQ copy the group's dead-letter queue holds (replicas and
    repeated dead-lettering collapsed), filtered by the request (or only by `ids`)."""
    m = io.read(table_path(lake, "messages"), schemas.MESSAGES)
    cond = F.col("is_dlq") & ~F.col("is_scheduled") & (F.col("consumer_group") == request.group)
    if ids is None:
        if request.topic is not None:
            cond &= F.col("original_topic") == request.topic
        if request.from_ms is not None:
            cond &= F.col("store_ts") >= request.from_ms
        if request.to_ms is not None:
            cond &= F.col("store_ts") <= request.to_ms
    key = F.coalesce(F.col("uniq_key"), F.col("origin_msg_id"), F.col("msg_id"))
    m = m.filter(cond).withColumn("_key", key)
    wanted = list(ids) if ids is not None else list(request.msg_ids)
    if wanted:
        m = m.filter(F.col("_key").isin(wanted))
    extra = ["body", "properties"] if with_body else []
    cols = ["original_topic", "msg_id", "store_ts", *extra]
    order = F.struct("store_ts", "broker_id", "broker", "phys_offset")
    first = m.groupBy("_key").agg(F.min_by(F.struct(*cols), order).alias("d"))
    return first.select(
        F.col("_key").alias("msg_id"),
        F.col("d.original_topic").alias("topic"),
        F.col("d.msg_id").alias("dlq_msg_id"),
        F.col("d.store_ts").alias("store_ts"),
        *[F.col(f"d.{c}").alias(c) for c in extra],
    )


def read_log(io: DeltaIO, lake: str, group: str) -> list[LogEntry]:
    df = io.read(DLQ_REPLAY_LOG.path(lake), DLQ_REPLAY_LOG.schema)
    return [LogEntry.of(r.asDict()) for r in df.filter(F.col("group") == group).collect()]


def _outcome_log(spark: SparkSession, io: DeltaIO, lake: str) -> OutcomeLog:
    path = DLQ_REPLAY_LOG.path(lake)
    io.ensure_table(path, DLQ_REPLAY_LOG.schema)
    return OutcomeLog(spark, io, path, DLQ_REPLAY_LOG.schema)


# -- the steps ----------------------------------------------------------------------------


def plan_step(
    lake: str,
    request: ReplayRequest,
    replay_id: str,
    *,
    target: BrokerTarget | None = None,
    spark: SparkSession | None = None,
    master: str | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Log the plan of `replay_id` (once) and return its summary. Unknown outcomes of earlier
    real runs are settled on the broker first (not in a dry run: those stay skipped)."""
    spark = _session(spark, master)
    io = DeltaIO(spark)
    reporter("replay", progress)(f"{replay_id}: {request.describe()}")
    rows = dead_letters_df(io, lake, request).collect()
    letters = sorted(
        (
            DeadLetter(r["msg_id"], request.group, r["topic"], r["dlq_msg_id"], r["store_ts"])
            for r in rows
        ),
        key=lambda d: (d.store_ts, d.msg_id),
    )
    reporter("replay", progress)(f"{len(letters)} dead letter(s) of {request.group} match")
    entries = read_log(io, lake, request.group)
    keys = {d.msg_id for d in letters}
    doubt = [e for e in in_doubt(entries, exclude_replay=replay_id) if e.msg_id in keys]
    settled: dict[str, int] = {}
    with _outcome_log(spark, io, lake) as log:
        if doubt and not request.dry_run and target is not None:
            reporter("replay", progress)(
                f"settling {len(doubt)} unknown outcome(s) of earlier runs on the broker"
            )
            with BrokerClient(target) as client:
                settled = reconcile(doubt, client, log, _entry, REPLAY_ID_PROPERTY)
            entries = read_log(io, lake, request.group)
        plan = plan_replay(replay_id, request, letters, entries, _now_ms())
        log.extend([e.as_row() for e in plan.rows])
    summary = {**plan.summary(), "matched": len(letters), "settled": settled}
    reporter("replay", progress)(
        f"plan: {summary['planned']} to send, {summary['skipped']} skipped "
        f"{summary['skipped_by_reason']}, {summary['left_over']} over max_messages"
    )
    return summary


def send_step(
    lake: str,
    request: ReplayRequest,
    replay_id: str,
    target: BrokerTarget,
    *,
    resume: bool = False,
    spark: SparkSession | None = None,
    master: str | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Send the plan's pending messages. `resume`: an earlier attempt of this replay may have
    sent some without logging it; those are looked up on the broker first."""
    if request.dry_run:
        reporter("replay", progress)(f"{replay_id}: dry run, nothing sent")
        return {"replay_id": replay_id, "dry_run": True, "sent": 0, "failed": 0}
    spark = _session(spark, master)
    io = DeltaIO(spark)
    counts = {"sent": 0, "failed": 0, "refused": 0}
    with _outcome_log(spark, io, lake) as log, BrokerClient(target, retry_times=0) as client:
        entries = [e for e in read_log(io, lake, request.group) if e.replay_id == replay_id]
        if resume:
            own = in_doubt(entries)
            if own:
                reporter("replay", progress)(
                    f"resuming: settling {len(own)} unknown outcome(s) on the broker"
                )
                reconcile(own, client, log, _entry, REPLAY_ID_PROPERTY)
                entries = [e for e in read_log(io, lake, request.group) if e.replay_id == replay_id]
        todo = pending(replay_id, entries)
        reporter("replay", progress)(
            f"{replay_id}: {len(todo)} message(s) to send at {request.messages_per_second:g}/s"
        )
        if todo:
            topics = {e.msg_id: e.topic for e in todo if e.topic is not None}
            found = dead_letters_df(io, lake, request, [e.msg_id for e in todo], with_body=True)
            messages = {
                r["msg_id"]: replay_message(
                    topics[r["msg_id"]], bytes(r["body"]), r["properties"] or {}, r["msg_id"],
                    replay_id, r["dlq_msg_id"],
                )
                for r in found.collect()
                if r["msg_id"] in topics
            }  # fmt: skip
            counts = send_all(
                todo, messages, client, log, _entry, rate=request.messages_per_second,
                missing="the dead letter is no longer in the lake", step="replay",
                progress=progress,
            )  # fmt: skip
    return {"replay_id": replay_id, "dry_run": False, **counts}


def _entry(e: LogEntry, status: Status, reason: str, stored: Stored | None) -> dict[str, Any]:
    offset = stored[2] if stored is not None else None
    return LogEntry(
        e.replay_id, e.msg_id, e.group, e.topic, status, reason, offset, _now_ms()
    ).as_row()


def replay_summary(
    lake: str, request: ReplayRequest, replay_id: str, *, spark: SparkSession | None = None
) -> dict[str, Any]:
    """Where every message of the replay stands (its latest log row), with a few examples."""
    io = DeltaIO(_session(spark, None))
    mine = (e for e in read_log(io, lake, request.group) if e.replay_id == replay_id)
    return {"replay_id": replay_id, "request": request.to_dict(), **where_they_stand(mine)}


def run_replay(
    lake: str,
    request: ReplayRequest,
    replay_id: str,
    target: BrokerTarget | None,
    *,
    spark: SparkSession | None = None,
    master: str | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Plan, send (unless a dry run) and sum up one replay; a replay id seen before resumes."""
    spark = _session(spark, master)
    if target is None and not request.dry_run:
        raise ValueError("a real replay needs the cluster's name servers")
    plan = plan_step(lake, request, replay_id, target=target, spark=spark, progress=progress)
    sent: dict[str, Any] = {"dry_run": True}
    if not request.dry_run and target is not None:
        resume = not plan["new_plan"]
        sent = send_step(
            lake, request, replay_id, target, resume=resume, spark=spark, progress=progress
        )
    return {"plan": plan, "send": sent, **replay_summary(lake, request, replay_id, spark=spark)}


if __name__ == "__main__":  # `python -m pipeline.jobs.replay ...`, the command's options
    from pipeline.cli import main

    sys.exit(main(["replay", *sys.argv[1:]]))
