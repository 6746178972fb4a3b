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

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from broker_runtime.common import findings
from broker_runtime.ledger.schema import StubStatus
from pipeline import audit_schemas
from pipeline.transforms.audit_common import (
    BROKER,
    QUEUE,
    below_min_offset,
    conform,
    latest_offsets,
    position_text,
    queue_min_offsets,
    stored_copies,
    undelivered_rows,
)

_NO_TAG = ""
# Where a position of `_positions` comes from: a stored copy, or a confirmed stub with no copy.
_COPY, _STUB = "copy", "stub"
_POSITION = ["uniq_key", "topic", "tags", "cluster", "broker", "queue_id", "queue_offset"]


def _lost() -> Column:
    """A confirmed stub with no copy whose queue still holds its offset: lost after ack."""
    return (F.col("source") == _STUB) & ~below_min_offset()


def _received_by(log: DataFrame) -> DataFrame:
    """(cluster, uniq_key) -> the groups that received it (`received_by`)."""
    return log.groupBy("cluster", F.col("msg_id").alias("uniq_key")).agg(
        F.collect_set("group").alias("received_by")
    )


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


def _positions(
    copies: DataFrame,
    stubs: DataFrame,
    messages: DataFrame,
    log: DataFrame,
    ingested: DataFrame,
    min_offsets: DataFrame,
) -> DataFrame:
    """Every stored copy and every confirmed stub without one (`source`), with its queue's
    min offset, the groups that received its key (`received_by`) and the groups that should
    have and did not (`missing`; a stub lost after ack is one row of its own).

    Tag subscriptions are inferred: a group subscribes to the (topic, tag) of the stored
    copies it received. One pass: the subscribers of each (topic, tag) are gathered over a
    window of the positions that also carries the rows to judge (joining the subscriptions
    back would compute the positions twice)."""
    from_stubs = _confirmed_absent(stubs, messages, ingested).select(
        F.col("msg_id").alias("uniq_key"),
        *_POSITION[1:],
        F.col("updated_at").alias("store_ts"),
        "created_at",
        "send_count",
        F.lit(_STUB).alias("source"),
    )
    from_copies = copies.select(
        *_POSITION,
        "store_ts",
        F.lit(None).cast("long").alias("created_at"),
        F.lit(None).cast("int").alias("send_count"),
        F.lit(_COPY).alias("source"),
    )
    per_tag = Window.partitionBy("cluster", "topic", "tag_key")
    is_copy = F.col("source") == _COPY
    subscribers = F.flatten(F.collect_set(F.when(is_copy, F.col("received_by"))).over(per_tag))
    received = F.coalesce(F.col("received_by"), F.array().cast("array<string>"))
    return (
        from_copies.unionByName(from_stubs)
        .join(min_offsets, on=QUEUE, how="left")
        .withColumn("tag_key", F.coalesce(F.col("tags"), F.lit(_NO_TAG)))
        .join(_received_by(log), on=["cluster", "uniq_key"], how="left")
        .withColumn("missing", F.array_except(F.array_distinct(subscribers), received))
    )


def _judged(rows: DataFrame) -> DataFrame:
    """`audit_losses` rows (before `conform`) of positions with their `group` and committed
    offset: the kind of each, or none (a backlog not reached yet)."""
    lost = _lost()
    expired = below_min_offset()
    passed = F.col("committed_offset") > F.col("queue_offset")
    kind = (
        F.when(lost, findings.LOST_AFTER_ACK)
        .when(expired, findings.EXPIRED_BEFORE_CONSUMED)
        .when(passed, findings.NEVER_DELIVERED)
        .otherwise(F.lit(None).cast("string"))
    )
    cause = (
        F.when(
            lost,
            F.when(F.col("received_by").isNotNull(), findings.ABSENT_AFTER_DELIVERY).otherwise(
                findings.ABSENT_FROM_COMMITLOG
            ),
        )
        .when(expired, findings.FILE_DELETED_BEFORE_DELIVERY)
        .otherwise(findings.OFFSET_PASSED_WITHOUT_DELIVERY)
    )
    where = position_text(F.col("broker"), F.col("topic"), F.col("queue_id"), F.col("queue_offset"))
    detail = (
        F.when(
            lost,
            F.format_string(
                "acknowledged at %s (send %d), no copy in any commitlog", where, F.col("send_count")
            ),
        )
        .when(
            expired,
            F.format_string(
                "%s is below the queue's min offset %d; never delivered to the group",
                where,
                F.col("min_offset"),
            ),
        )
        .otherwise(
            F.format_string(
                "committed offset %d passed %s; never delivered to the group",
                F.col("committed_offset"),
                where,
            )
        )
    )
    # A lost stub's row is first seen when it was sent, last when it was acknowledged.
    first_ts = F.when(lost, F.col("created_at")).otherwise(F.col("store_ts"))
    found = rows.withColumn("kind", kind).filter(F.col("kind").isNotNull())
    return undelivered_rows(found, F.col("uniq_key"), F.col("kind"), cause, detail, first_ts)


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
    `stored_copies(messages)`, where the caller has it."""
    copies = stored_copies(messages) if copies is None else copies
    positions = _positions(copies, stubs, messages, log, ingested, queue_min_offsets(offsets))
    # A lost stub is one row (no group); any other position, one row per group missing it.
    groups = F.when(_lost(), F.array(F.lit(None).cast("string"))).otherwise(F.col("missing"))
    rows = positions.withColumn("group", F.explode(groups)).drop("missing")
    if sql_groups is not None:  # (a lost stub's null group matches none of them)
        rows = rows.join(sql_groups, on=["group", *BROKER, "topic"], how="left_anti")
    latest = latest_offsets(offsets).select(*QUEUE, "group", "committed_offset")
    rows = rows.join(latest, on=[*QUEUE, "group"], how="left")
    return _judged(rows).transform(conform(audit_schemas.AUDIT_LOSSES, as_of_ms))
