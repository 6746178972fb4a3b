"""`audit_losses`: messages acknowledged but not stored, or stored but never delivered.

- `lost_after_ack`: the producer's stub is CONFIRMED at a queue position, and no copy with its
  UNIQ_KEY is in any commitlog. Only stubs confirmed before the ingest read the logs are
  judged (`ingested`: per broker, the time its log was last read to the end), and only for
  brokers in the lake; a stub below its queue's min offset expired instead (below).
- `never_delivered`: a stored message that a group subscribes to, whose committed offset in
  the latest snapshot has passed it, with no delivery of it to that group in the message log.
- `expired_before_consumed`: a stored message (or a confirmed stub) below its queue's min
  offset (its file was deleted) that a subscribing group never received.

Tag subscriptions are not in the lake; a group is taken to subscribe to the (topic, tag) pairs
it has received at least once, so that messages a tag filter skipped are not reported. A group
with a SQL92 expression on a broker's topic (`sql_groups`: group, cluster, broker, topic) is left
to the filter audit (pipeline.transforms.filter_audit), which knows which messages it takes: it
reports a matching message passed by the offset as `matched_but_skipped`, and a matching one
whose file was deleted first as `expired_before_consumed` (rows of this table:
`expired_unreceived`, which the audit job adds here).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from broker_runtime.common import findings
from broker_runtime.ledger.schema import StubStatus
from pipeline import audit_schemas
from pipeline.transforms.audit_common import (
    BROKER,
    QUEUE,
    conform,
    latest_offsets,
    position_text,
    queue_min_offsets,
    stored_copies,
    undelivered_rows,
)

_NO_TAG = ""


def _tag_key(tags: str) -> Column:
    return F.coalesce(F.col(tags), F.lit(_NO_TAG))


def _received_by(log: DataFrame) -> DataFrame:
    """(cluster, uniq_key) -> the groups that received it (`received_by`)."""
    return log.groupBy("cluster", F.col("msg_id").alias("uniq_key")).agg(
        F.collect_set("group").alias("received_by")
    )


def _subscriptions(positions: DataFrame) -> DataFrame:
    """(cluster, group, topic, tag key) a group has received at least one message of;
    `positions`: stored copies with their `received_by` and `tag_key`."""
    return positions.select(
        "cluster", F.explode("received_by").alias("group"), "topic", "tag_key"
    ).distinct()


def _confirmed_absent(stubs: DataFrame, messages: DataFrame, ingested: DataFrame) -> DataFrame:
    """CONFIRMED stubs of ingested brokers, confirmed before their log was read, with no copy."""
    stored_keys = messages.filter(F.col("uniq_key").isNotNull()).select(
        "cluster", F.col("uniq_key").alias("msg_id")
    )
    return (
        stubs.filter(
            (F.col("status") == StubStatus.CONFIRMED.value) & F.col("queue_offset").isNotNull()
        )
        .join(ingested, on=BROKER, how="inner")
        .filter(F.col("updated_at") <= F.col("ingested_to_ms"))
        .join(stored_keys, on=["cluster", "msg_id"], how="left_anti")
    )


def lost_after_ack(
    stubs: DataFrame,
    messages: DataFrame,
    log: DataFrame,
    min_offsets: DataFrame,
    ingested: DataFrame,
) -> DataFrame:
    absent = _confirmed_absent(stubs, messages, ingested).join(min_offsets, on=QUEUE, how="left")
    lost = absent.filter(
        F.col("min_offset").isNull() | (F.col("queue_offset") >= F.col("min_offset"))
    )
    delivered = log.select("cluster", "msg_id").distinct().withColumn("delivered", F.lit(True))
    lost = lost.join(delivered, on=["cluster", "msg_id"], how="left")
    where = position_text(F.col("broker"), F.col("topic"), F.col("queue_id"), F.col("queue_offset"))
    return lost.select(
        "msg_id",
        F.lit(None).cast("string").alias("group"),
        F.lit(findings.LOST_AFTER_ACK).alias("kind"),
        F.when(F.col("delivered"), findings.ABSENT_AFTER_DELIVERY)
        .otherwise(findings.ABSENT_FROM_COMMITLOG)
        .alias("cause"),
        F.lit(1).cast("long").alias("count"),
        "topic",
        "cluster",
        "broker",
        "queue_id",
        "queue_offset",
        F.col("created_at").alias("first_ts"),
        F.col("updated_at").alias("last_ts"),
        F.lit(None).cast("long").alias("committed_offset"),
        "min_offset",
        F.format_string(
            "acknowledged at %s (send %d), no copy in any commitlog", where, F.col("send_count")
        ).alias("detail"),
    )


def _expired_stub_positions(
    stubs: DataFrame, messages: DataFrame, min_offsets: DataFrame, ingested: DataFrame
) -> DataFrame:
    """Confirmed stubs missing from the lake because their queue's files were deleted."""
    absent = _confirmed_absent(stubs, messages, ingested).join(min_offsets, on=QUEUE, how="inner")
    return absent.filter(F.col("queue_offset") < F.col("min_offset")).select(
        F.col("msg_id").alias("uniq_key"),
        "topic",
        "tags",
        "cluster",
        "broker",
        "queue_id",
        "queue_offset",
        F.col("updated_at").alias("store_ts"),
    )


def undelivered(
    messages: DataFrame,
    stubs: DataFrame,
    log: DataFrame,
    offsets: DataFrame,
    ingested: DataFrame,
    sql_groups: DataFrame | None = None,
    copies: DataFrame | None = None,
) -> DataFrame:
    """never_delivered and expired_before_consumed rows; `copies`: `stored_copies(messages)`,
    where the caller has it."""
    copies = stored_copies(messages) if copies is None else copies
    min_offsets = queue_min_offsets(offsets)
    # Each position with the groups that received its key: one join of the positions with
    # the log gives both the subscriptions and who has not received a message yet.
    received_by = _received_by(log)
    columns = ["uniq_key", "topic", "tags", "cluster", "broker", "queue_id", "queue_offset"]
    stored = (
        copies.select(*columns, "store_ts")
        .withColumn("tag_key", _tag_key("tags"))
        .join(received_by, on=["cluster", "uniq_key"], how="left")
    )
    expired_stubs = (
        _expired_stub_positions(stubs, messages, min_offsets, ingested)
        .withColumn("tag_key", _tag_key("tags"))
        .join(received_by, on=["cluster", "uniq_key"], how="left")
    )
    latest = latest_offsets(offsets).select(*QUEUE, "group", "committed_offset")
    subscriptions = _subscriptions(stored)
    # A stored copy's receivers are among its (topic, tag)'s subscribers, by the definition
    # of subscribing: only a copy with fewer receivers than subscribers has a group to check
    # (few, in a large lake; each row would otherwise turn into a row per subscriber).
    subscribers = subscriptions.groupBy("cluster", "topic", "tag_key").agg(
        F.count(F.lit(1)).alias("subscribers")
    )
    missed = (
        stored.join(subscribers, on=["cluster", "topic", "tag_key"], how="inner")
        .filter(F.coalesce(F.size("received_by"), F.lit(0)) < F.col("subscribers"))
        .drop("subscribers")
    )
    candidates = (
        missed.unionByName(expired_stubs)
        .join(subscriptions, on=["cluster", "topic", "tag_key"], how="inner")
        .filter(~F.coalesce(F.array_contains("received_by", F.col("group")), F.lit(False)))
        .drop("received_by")
    )
    if sql_groups is not None:
        candidates = candidates.join(sql_groups, on=["group", *BROKER, "topic"], how="left_anti")
    candidates = candidates.join(latest, on=[*QUEUE, "group"], how="left").join(
        min_offsets, on=QUEUE, how="left"
    )
    expired = F.col("min_offset").isNotNull() & (F.col("queue_offset") < F.col("min_offset"))
    passed = F.col("committed_offset") > F.col("queue_offset")
    kind = (
        F.when(expired, findings.EXPIRED_BEFORE_CONSUMED)
        .when(passed, findings.NEVER_DELIVERED)
        .otherwise(F.lit(None).cast("string"))
    )
    where = position_text(F.col("broker"), F.col("topic"), F.col("queue_id"), F.col("queue_offset"))
    cause = F.when(expired, findings.FILE_DELETED_BEFORE_DELIVERY).otherwise(
        findings.OFFSET_PASSED_WITHOUT_DELIVERY
    )
    detail = F.when(
        expired,
        F.format_string(
            "%s is below the queue's min offset %d; never delivered to the group",
            where,
            F.col("min_offset"),
        ),
    ).otherwise(
        F.format_string(
            "committed offset %d passed %s; never delivered to the group",
            F.col("committed_offset"),
            where,
        )
    )
    found = candidates.withColumn("kind", kind).filter(F.col("kind").isNotNull())
    return undelivered_rows(found, F.col("uniq_key"), F.col("kind"), cause, detail)


def audit_losses(
    messages: DataFrame,
    stubs: DataFrame,
    log: DataFrame,
    offsets: DataFrame,
    ingested: DataFrame,
    as_of_ms: int,
    sql_groups: DataFrame | None = None,
    copies: DataFrame | None = None,
) -> DataFrame:
    """The `audit_losses` table; `ingested` has (cluster, broker, ingested_to_ms); `copies`:
    see `undelivered`."""
    min_offsets = queue_min_offsets(offsets)
    return (
        lost_after_ack(stubs, messages, log, min_offsets, ingested)
        .unionByName(undelivered(messages, stubs, log, offsets, ingested, sql_groups, copies))
        .transform(conform(audit_schemas.AUDIT_LOSSES, as_of_ms))
    )
