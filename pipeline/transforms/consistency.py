"""`consistency`: the broker's own files disagreeing with each other or with their past.

- `cq_without_message`: a ConsumeQueue entry whose log offset holds no message of that topic,
  queue, queue offset and size in the same replica's commitlog (cause: the bytes there were
  quarantined, no message starts there, or another message does);
- `offset_regression`: between two consumer offset snapshots a group's committed offset, or a
  queue's max offset, went back (count: by how many messages);
- `queue_offset_gap`: queue offsets missing between two stored messages of one queue in one
  replica's commitlog (count: how many; cause: quarantined bytes in between, or missing).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from broker_runtime.common import findings
from pipeline import audit_schemas
from pipeline.transforms.audit_common import QUEUE, conform

_REPLICA = ["cluster", "broker", "broker_id"]


def _none(kind: str) -> Column:
    return F.lit(None).cast(kind)


def _in_quarantine(quarantine: DataFrame, lo: Column, hi: Column) -> tuple[DataFrame, Column]:
    """Quarantine ranges of the replica overlapping [lo, hi] (columns of the other side)."""
    q = quarantine.select(
        F.col("cluster").alias("q_cluster"),
        F.col("broker").alias("q_broker"),
        F.col("broker_id").alias("q_broker_id"),
        F.col("log_offset").alias("q_lo"),
        (F.col("log_offset") + F.col("length")).alias("q_hi"),
    )
    return q, (F.col("q_lo") <= hi) & (lo < F.col("q_hi"))


def cq_without_message(cq: DataFrame, messages: DataFrame, quarantine: DataFrame) -> DataFrame:
    units = messages.select(
        *_REPLICA,
        "phys_offset",
        F.col("topic").alias("m_topic"),
        F.col("queue_id").alias("m_queue_id"),
        F.col("queue_offset").alias("m_queue_offset"),
        F.col("total_size").alias("m_size"),
        F.col("uniq_key").alias("m_key"),
        F.col("store_ts").alias("m_store_ts"),
    )
    joined = cq.join(units, on=[*_REPLICA, "phys_offset"], how="left")
    matches = (
        (F.col("m_topic") == F.col("topic"))
        & (F.col("m_queue_id") == F.col("queue_id"))
        & (F.col("m_queue_offset") == F.col("queue_offset"))
        & (F.col("m_size") == F.col("size"))
    )
    bad = joined.filter(F.col("m_topic").isNull() | ~matches)
    q, overlaps = _in_quarantine(quarantine, F.col("phys_offset"), F.col("phys_offset"))
    on = (
        (F.col("q_cluster") == F.col("cluster"))
        & (F.col("q_broker") == F.col("broker"))
        & (F.col("q_broker_id") == F.col("broker_id"))
        & overlaps
    )
    flagged = (
        bad.join(q, on=on, how="left")
        .groupBy(*bad.columns)
        .agg(F.max(F.col("q_lo").isNotNull()).alias("quarantined"))
    )
    cause = (
        F.when(F.col("m_topic").isNotNull(), "points_at_other_message")
        .when(F.col("quarantined"), "message_quarantined")
        .otherwise("no_message_at_offset")
    )
    detail = F.format_string(
        "entry %s/%d@%d -> log offset %d size %d; the log has %s",
        F.col("topic"),
        F.col("queue_id"),
        F.col("queue_offset"),
        F.col("phys_offset"),
        F.col("size"),
        F.when(
            F.col("m_topic").isNotNull(),
            F.format_string(
                "%s/%d@%d size %d",
                F.col("m_topic"),
                F.col("m_queue_id"),
                F.col("m_queue_offset"),
                F.col("m_size"),
            ),
        ).otherwise("no message there"),
    )
    return flagged.select(
        F.col("m_key").alias("msg_id"),
        _none("string").alias("group"),
        F.lit(findings.CQ_WITHOUT_MESSAGE).alias("kind"),
        cause.alias("cause"),
        F.lit(1).cast("long").alias("count"),
        *QUEUE,
        "broker_id",
        "queue_offset",
        "phys_offset",
        F.col("m_store_ts").alias("first_ts"),
        F.col("m_store_ts").alias("last_ts"),
        detail.alias("detail"),
    )


def _regressions(series: DataFrame, keys: list[str], value: str) -> DataFrame:
    """Rows of `series` whose `value` is below the previous snapshot's, with `prev`."""
    order = Window.partitionBy(*keys).orderBy(F.col("snapshot_ts"))
    return (
        series.withColumns(
            {"prev": F.lag(value).over(order), "prev_ts": F.lag("snapshot_ts").over(order)}
        )
        .filter(F.col(value) < F.col("prev"))
        .withColumn("count", (F.col("prev") - F.col(value)).cast("long"))
    )


def offset_regressions(offsets: DataFrame) -> DataFrame:
    """`offsets`: as audit_common.preferred_offsets returns them."""
    committed = _regressions(offsets, ["group", *QUEUE], "committed_offset").select(
        _none("string").alias("msg_id"),
        "group",
        F.lit("committed_offset_went_back").alias("cause"),
        "count",
        *QUEUE,
        "broker_id",
        F.col("committed_offset").alias("queue_offset"),
        "prev_ts",
        "snapshot_ts",
        F.format_string(
            "committed offset %d -> %d", F.col("prev"), F.col("committed_offset")
        ).alias("detail"),
    )
    maxima = offsets.groupBy(*QUEUE, "broker_id", "snapshot_ts").agg(
        F.max("max_offset").alias("max_offset")
    )
    queue_max = _regressions(maxima, QUEUE, "max_offset").select(
        _none("string").alias("msg_id"),
        _none("string").alias("group"),
        F.lit("max_offset_went_back").alias("cause"),
        "count",
        *QUEUE,
        "broker_id",
        F.col("max_offset").alias("queue_offset"),
        "prev_ts",
        "snapshot_ts",
        F.format_string("max offset %d -> %d", F.col("prev"), F.col("max_offset")).alias("detail"),
    )
    return (
        committed.unionByName(queue_max)
        .withColumns({"kind": F.lit(findings.OFFSET_REGRESSION), "phys_offset": _none("long")})
        .withColumnRenamed("prev_ts", "first_ts")
        .withColumnRenamed("snapshot_ts", "last_ts")
    )


def queue_offset_gaps(messages: DataFrame, quarantine: DataFrame) -> DataFrame:
    per_queue = Window.partitionBy(*_REPLICA, "topic", "queue_id").orderBy(F.col("queue_offset"))
    stepped = (
        messages.filter(F.col("queue_offset").isNotNull())
        .select(*_REPLICA, "topic", "queue_id", "queue_offset", "phys_offset", "store_ts")
        .withColumns(
            {
                "prev_offset": F.lag("queue_offset").over(per_queue),
                "prev_phys": F.lag("phys_offset").over(per_queue),
                "prev_ts": F.lag("store_ts").over(per_queue),
            }
        )
    )
    gaps = stepped.filter(F.col("queue_offset") - F.col("prev_offset") > 1)
    q, overlaps = _in_quarantine(quarantine, F.col("prev_phys"), F.col("phys_offset"))
    on = (
        (F.col("q_cluster") == F.col("cluster"))
        & (F.col("q_broker") == F.col("broker"))
        & (F.col("q_broker_id") == F.col("broker_id"))
        & overlaps
    )
    flagged = (
        gaps.join(q, on=on, how="left")
        .groupBy(*gaps.columns)
        .agg(F.max(F.col("q_lo").isNotNull()).alias("quarantined"))
    )
    return flagged.select(
        _none("string").alias("msg_id"),
        _none("string").alias("group"),
        F.lit(findings.QUEUE_OFFSET_GAP).alias("kind"),
        F.when(F.col("quarantined"), "quarantined_bytes_between")
        .otherwise("offsets_missing")
        .alias("cause"),
        (F.col("queue_offset") - F.col("prev_offset") - 1).cast("long").alias("count"),
        *QUEUE,
        "broker_id",
        "queue_offset",
        "phys_offset",
        F.col("prev_ts").alias("first_ts"),
        F.col("store_ts").alias("last_ts"),
        F.format_string(
            "queue offsets %d..%d missing between log offsets %d and %d",
            F.col("prev_offset") + 1,
            F.col("queue_offset") - 1,
            F.col("prev_phys"),
            F.col("phys_offset"),
        ).alias("detail"),
    )


def audit_consistency(
    cq: DataFrame,
    messages: DataFrame,
    offsets: DataFrame,
    quarantine: DataFrame,
    as_of_ms: int,
) -> DataFrame:
    """The `consistency` table."""
    return (
        cq_without_message(cq, messages, quarantine)
        .unionByName(offset_regressions(offsets))
        .unionByName(queue_offset_gaps(messages, quarantine))
        .transform(conform(audit_schemas.CONSISTENCY, as_of_ms))
    )
