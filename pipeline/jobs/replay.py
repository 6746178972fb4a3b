"""The DLQ replay job: dead letters from the lake back to their original topics, safely.

Three steps, run by the replay DAG as tasks or by `mqaudit pipeline replay` in one go:
`plan_step` (match dead letters, settle earlier runs' unknown outcomes against the broker,
log the plan), `send_step` (send what the plan still has pending at the asked rate, log each
outcome; on resume settle this replay's own unknown outcomes first) and `replay_summary`.
Every event lands in the Delta table `dlq_replay_log` (see pipeline.remediation.replay_plan).
A request of `system` rabbitmq replays RabbitMQ dead letters (pipeline.jobs.rabbit_replay)
through the same plan and send loop, to a `RabbitTarget`.
Runnable as `python -m pipeline.jobs.replay ...` (spark-submit) with the CLI's options.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, TypeAlias

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from broker_runtime.common.findings import RABBITMQ, ROCKETMQ
from broker_runtime.common.message import REPLAY_ID_PROPERTY
from broker_runtime.common.progress import reporter
from pipeline import schemas
from pipeline.delta_io import DeltaIO
from pipeline.jobs import rabbit_replay
from pipeline.lake import DLQ_REPLAY_LOG, one_cluster, table_path
from pipeline.remediation.outcome_log import OutcomeLog
from pipeline.remediation.rabbit_sender import RabbitClient, RabbitTarget
from pipeline.remediation.replay_plan import (
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
from pipeline.remediation.sender import BrokerClient, BrokerTarget, Stored
from pipeline.remediation.sends import Row, reconcile, send_all
from pipeline.spark_session import apply_sql_conf, build_spark

Target: TypeAlias = BrokerTarget | RabbitTarget


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
    cond &= F.col("cluster") == request.cluster
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


def read_log(io: DeltaIO, lake: str, request: ReplayRequest) -> list[LogEntry]:
    """The replay log's entries of the request's cluster, group and system."""
    df = io.read(DLQ_REPLAY_LOG.path(lake), DLQ_REPLAY_LOG.schema)
    system = F.coalesce(F.col("system"), F.lit(ROCKETMQ))
    mine = (F.col("group") == request.group) & (system == request.system)
    mine &= F.col("cluster") == request.cluster
    return [LogEntry.of(r.asDict()) for r in df.filter(mine).collect()]


def _for_cluster(lake: str, request: ReplayRequest) -> ReplayRequest:
    """The request with its cluster named (the lake's only one if it names none)."""
    return replace(request, cluster=one_cluster(lake, request.cluster))


def _client(request: ReplayRequest, target: Target) -> BrokerClient | RabbitClient:
    """A client of the request's system, to use as a context manager."""
    if isinstance(target, RabbitTarget) != (request.system == RABBITMQ):
        raise ValueError(f"a {request.system} replay cannot send to {type(target).__name__}")
    if isinstance(target, RabbitTarget):
        return RabbitClient(target.url)
    return BrokerClient(target, retry_times=0)


def _letters(io: DeltaIO, lake: str, request: ReplayRequest) -> list[DeadLetter]:
    """The dead letters the request matches, oldest first."""
    if request.system == RABBITMQ:
        rows = rabbit_replay.dead_letters_df(io, lake, request).collect()
    else:
        rows = dead_letters_df(io, lake, request).collect()
    letters = (
        DeadLetter(r["msg_id"], request.group, r["topic"], r["dlq_msg_id"], r["store_ts"])
        for r in rows
    )
    return sorted(letters, key=lambda d: (d.store_ts, d.msg_id))


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
    target: Target | None = None,
    spark: SparkSession | None = None,
    master: str | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Log the plan of `replay_id` (once) and return its summary. Unknown outcomes of earlier
    real runs are settled on the broker first (not in a dry run: those stay skipped)."""
    spark = _session(spark, master)
    io = DeltaIO(spark)
    request = _for_cluster(lake, request)
    reporter("replay", progress)(f"{replay_id}: {request.describe()} in {request.cluster}")
    letters = _letters(io, lake, request)
    reporter("replay", progress)(f"{len(letters)} dead letter(s) of {request.group} match")
    entries = read_log(io, lake, request)
    keys = {d.msg_id for d in letters}
    doubt = [e for e in in_doubt(entries, exclude_replay=replay_id) if e.msg_id in keys]
    settled: dict[str, int] = {}
    with _outcome_log(spark, io, lake) as log:
        if doubt and not request.dry_run and target is not None:
            reporter("replay", progress)(
                f"settling {len(doubt)} unknown outcome(s) of earlier runs on the broker"
            )
            with _client(request, target) as client:
                settled = reconcile(doubt, client, log, _entry(request), REPLAY_ID_PROPERTY)
            entries = read_log(io, lake, request)
        plan = plan_replay(replay_id, request, letters, entries, _now_ms())
        log.extend([_named(e.as_row(), request) for e in plan.rows])
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
    target: Target,
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
    request = _for_cluster(lake, request)
    counts = {"sent": 0, "failed": 0, "refused": 0}
    row = _entry(request)
    with _outcome_log(spark, io, lake) as log, _client(request, target) as client:
        entries = _mine(io, lake, request, replay_id)
        if resume:
            own = in_doubt(entries)
            if own:
                reporter("replay", progress)(
                    f"resuming: settling {len(own)} unknown outcome(s) on the broker"
                )
                reconcile(own, client, log, row, REPLAY_ID_PROPERTY)
                entries = _mine(io, lake, request, replay_id)
        todo = pending(replay_id, entries)
        reporter("replay", progress)(
            f"{replay_id}: {len(todo)} message(s) to send at {request.messages_per_second:g}/s"
        )
        if todo:
            messages = _messages(io, lake, request, replay_id, todo, target)
            counts = send_all(
                todo, messages, client, log, row, rate=request.messages_per_second,
                missing=_MISSING[request.system], step="replay", progress=progress,
            )  # fmt: skip
    return {"replay_id": replay_id, "dry_run": False, **counts}


_MISSING = {
    ROCKETMQ: "the dead letter is no longer in the lake",
    RABBITMQ: "no kept body whose sha256 is the stub's (or the dead letter is no longer in the "
    "lake): the producer must keep bodies (LedgeredPublisher(keep_bodies=True))",
}


def _mine(io: DeltaIO, lake: str, request: ReplayRequest, replay_id: str) -> list[LogEntry]:
    return [e for e in read_log(io, lake, request) if e.replay_id == replay_id]


def _messages(
    io: DeltaIO, lake: str, request: ReplayRequest, replay_id: str, todo: Sequence[LogEntry],
    target: Target,
) -> dict[str, Any]:  # fmt: skip
    """What to send for each pending entry that can be sent, by msg_id."""
    ids = [e.msg_id for e in todo]
    if isinstance(target, RabbitTarget):
        return rabbit_replay.replay_messages(io, lake, request, replay_id, ids, target)
    topics = {e.msg_id: e.topic for e in todo if e.topic is not None}
    found = dead_letters_df(io, lake, request, ids, with_body=True)
    return {
        r["msg_id"]: replay_message(
            topics[r["msg_id"]], bytes(r["body"]), r["properties"] or {}, r["msg_id"],
            replay_id, r["dlq_msg_id"],
        )
        for r in found.collect()
        if r["msg_id"] in topics
    }  # fmt: skip


def _named(row: dict[str, Any], request: ReplayRequest) -> dict[str, Any]:
    """A log row with the request's system and cluster."""
    return {**row, "system": request.system, "cluster": request.cluster}


def _entry(request: ReplayRequest) -> Row:
    """The log row of an outcome of the request's replay."""

    def row(e: LogEntry, status: Status, reason: str, stored: Stored | None) -> dict[str, Any]:
        offset = stored[2] if stored is not None else None
        entry = LogEntry(e.replay_id, e.msg_id, e.group, e.topic, status, reason, offset, _now_ms())
        return _named(entry.as_row(), request)

    return row


def replay_summary(
    lake: str, request: ReplayRequest, replay_id: str, *, spark: SparkSession | None = None
) -> dict[str, Any]:
    """Where every message of the replay stands (its latest log row), with a few examples."""
    io = DeltaIO(_session(spark, None))
    request = _for_cluster(lake, request)
    mine = _mine(io, lake, request, replay_id)
    return {"replay_id": replay_id, "request": request.to_dict(), **where_they_stand(mine)}


def run_replay(
    lake: str,
    request: ReplayRequest,
    replay_id: str,
    target: Target | None,
    *,
    spark: SparkSession | None = None,
    master: str | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Plan, send (unless a dry run) and sum up one replay; a replay id seen before resumes."""
    spark = _session(spark, master)
    if target is None and not request.dry_run:
        raise ValueError("a real replay needs the cluster's name servers (RabbitMQ: its URL)")
    request = _for_cluster(lake, request)  # once: the steps below see it named
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
