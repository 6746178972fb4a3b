"""`audit_dead_letters`: every message in a `%DLQ%{group}` topic, one row per (group, msg_id),
with its retry chain, its deliveries to the group and whether it was replayed.

`count` is the dead-letter copy's reconsume times: how many consumptions failed before the
broker gave up. The chain lists the copies the broker stored in `%RETRY%{group}` (the
delivered ones, not their SCHEDULE_TOPIC_XXXX waiting copies). `replayed` comes from the
replay DAG's `dlq_replay_log` (a `sent` row for the message and group).
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from broker_runtime.common import findings
from pipeline import audit_schemas
from pipeline.transforms.audit_common import conform, stored_copies

_KEY = ["cluster", "group", "msg_id"]
REPLAY_SENT = "sent"


def _key(messages: DataFrame) -> DataFrame:
    """(cluster, group, msg_id) of dead-letter and retry copies, replicas collapsed by log
    offset."""
    msg_id = F.coalesce(F.col("uniq_key"), F.col("origin_msg_id"), F.col("msg_id"))
    return (
        messages.withColumns({"group": F.col("consumer_group"), "_key": msg_id})
        .groupBy("cluster", "group", "_key", "broker", "phys_offset")
        .agg(
            F.min("topic").alias("topic"),
            F.min("queue_id").alias("queue_id"),
            F.min("queue_offset").alias("queue_offset"),
            F.min("store_ts").alias("store_ts"),
            F.min("reconsume_times").alias("reconsume_times"),
            F.min("original_topic").alias("original_topic"),
            F.min("origin_msg_id").alias("origin_msg_id"),
        )
        .withColumnRenamed("_key", "msg_id")
    )


def _chains(messages: DataFrame) -> DataFrame:
    retries = messages.filter(F.col("is_retry") & ~F.col("is_scheduled") & ~F.col("is_dlq"))
    step = F.struct("reconsume_times", "store_ts", "broker", "queue_offset")
    return (
        _key(retries)
        .groupBy(*_KEY)
        .agg(
            F.array_sort(F.collect_list(step))
            .cast(audit_schemas.AUDIT_DEAD_LETTERS["retry_chain"].dataType)
            .alias("retry_chain")
        )
    )


def _deliveries(log: DataFrame) -> DataFrame:
    return log.groupBy(*_KEY).agg(
        F.count(F.lit(1)).alias("deliveries"),
        F.max_by("outcome", F.struct("received_at", "id")).alias("last_outcome"),
    )


def replays(replay_log: DataFrame) -> DataFrame:
    """Per (cluster, group, msg_id): whether a replay sent it, its latest replay status and
    when."""
    sent = F.col("status") == REPLAY_SENT
    return replay_log.groupBy(*_KEY).agg(
        F.max(sent).alias("replayed"),
        F.max_by("status", F.struct("ts", "replay_id")).alias("replay_status"),
        F.max(F.when(sent, F.col("ts"))).alias("replayed_at"),
    )


def audit_dead_letters(
    messages: DataFrame,
    log: DataFrame,
    replay_log: DataFrame,
    as_of_ms: int,
    copies: DataFrame | None = None,
) -> DataFrame:
    """The `audit_dead_letters` table; `replay_log` may be empty (no replays yet); `copies`:
    `stored_copies(messages)`, where the caller has it."""
    dead = _key(messages.filter(F.col("is_dlq") & ~F.col("is_scheduled")))
    per_msg = dead.groupBy(*_KEY).agg(
        F.max("reconsume_times").cast("long").alias("count"),
        F.min_by(F.struct("topic", "broker", "queue_id", "queue_offset"), "store_ts").alias(
            "first"
        ),
        F.min("original_topic").alias("original_topic"),
        F.min("origin_msg_id").alias("origin_msg_id"),
        F.max("store_ts").alias("last_ts"),
    )
    # Originals and deliveries of the dead letters only (few, in a large lake).
    dead_keys = per_msg.select("cluster", "msg_id").distinct()
    originals = (
        (stored_copies(messages) if copies is None else copies)
        .withColumnRenamed("uniq_key", "msg_id")
        .join(dead_keys, on=["cluster", "msg_id"], how="left_semi")
        .groupBy("cluster", "msg_id")
        .agg(F.min("store_ts").alias("first_ts"))
    )
    deliveries = log.join(dead_keys, on=["cluster", "msg_id"], how="left_semi")
    rows = (
        per_msg.join(originals, on=["cluster", "msg_id"], how="left")
        .join(_chains(messages), on=_KEY, how="left")
        .join(_deliveries(deliveries), on=_KEY, how="left")
        .join(replays(replay_log), on=_KEY, how="left")
    )
    chain = F.coalesce(
        F.col("retry_chain"),
        F.array().cast(audit_schemas.AUDIT_DEAD_LETTERS["retry_chain"].dataType),
    )
    cause = F.when(F.col("count") > 1, findings.MAX_RECONSUME_TIMES).otherwise(
        findings.SENT_TO_DLQ_DIRECTLY
    )
    return rows.select(
        "msg_id",
        "group",
        F.lit(findings.DEAD_LETTERED).alias("kind"),
        cause.alias("cause"),
        "count",
        F.col("first.topic").alias("topic"),
        "cluster",
        F.col("first.broker").alias("broker"),
        F.col("first.queue_id").alias("queue_id"),
        F.col("first.queue_offset").alias("queue_offset"),
        "original_topic",
        "origin_msg_id",
        "first_ts",
        "last_ts",
        F.greatest(F.lit(as_of_ms) - F.col("last_ts"), F.lit(0)).alias("age_ms"),
        F.size(chain).alias("retries"),
        chain.alias("retry_chain"),
        F.coalesce(F.col("deliveries"), F.lit(0)).alias("deliveries"),
        "last_outcome",
        F.coalesce(F.col("replayed"), F.lit(False)).alias("replayed"),
        "replay_status",
        "replayed_at",
    ).transform(conform(audit_schemas.AUDIT_DEAD_LETTERS, as_of_ms))
