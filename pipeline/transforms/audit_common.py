"""What the audit transforms share: stored copies, the offset series per broker, the final
select that is each audit table's schema contract."""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from broker_runtime.common.topics import RETRY_PREFIX, TRANS_SYSTEM_TOPICS
from broker_runtime.ledger.schema import Outcome

Transform = Callable[[DataFrame], DataFrame]

CONSUMED = Outcome.CONSUMED.value
FAILURES = [Outcome.RECONSUME_LATER.value, Outcome.FAILED.value]

# One stored copy of a message: master and slave hold the same unit at the same log offset,
# so (cluster, broker group, log offset, UNIQ_KEY) names a copy once, whichever replicas
# have it. Two clusters may both have a broker-a: a broker is (cluster, broker) everywhere.
BROKER = ["cluster", "broker"]
COPY = [*BROKER, "phys_offset", "uniq_key"]
QUEUE = [*BROKER, "topic", "queue_id"]

# The slim view of `messages` the audits read (no bodies or property maps).
MESSAGE_COLUMNS = [
    "cluster",
    "broker",
    "broker_id",
    "phys_offset",
    "total_size",
    "msg_id",
    "topic",
    "queue_id",
    "queue_offset",
    "uniq_key",
    "tags",
    "store_ts",
    "reconsume_times",
    "original_topic",
    "origin_msg_id",
    "consumer_group",
    "is_retry",
    "is_dlq",
    "is_scheduled",
]


# Columns the audit tables gained later, and what rows of a transform that does not give
# them hold: RocketMQ's findings, without RabbitMQ's x-death history.
ADDED_COLUMNS: dict[str, str | None] = {"system": "rocketmq", "death": None}


def conform(schema: StructType, as_of_ms: int) -> Transform:
    """The final select: `schema`'s columns in order and types, `as_of_ms` stamped.

    Every other column must be there (a transform says `F.lit(None)` for what does not
    apply; ADDED_COLUMNS excepted), so that a misspelt column fails here instead of turning
    into nulls.
    """

    def apply(df: DataFrame) -> DataFrame:
        names = [f.name for f in schema.fields if f.name != "as_of_ms"]
        have = set(df.columns)  # each `df.columns` asks the JVM for the plan's schema
        missing = [n for n in names if n not in have and n not in ADDED_COLUMNS]
        if missing:
            raise ValueError(f"audit rows lack column(s) {missing} of the table's schema")
        df = df.withColumns(
            {n: F.lit(v) for n, v in ADDED_COLUMNS.items() if n in names and n not in have}
        )
        # SQL text: one call to the JVM for the whole select (a Column per field costs
        # dozens of round trips: thousands over the audit's tables).
        values = {f.name: f"`{f.name}`" for f in schema.fields} | {"as_of_ms": str(as_of_ms)}
        return df.selectExpr(
            *[
                f"CAST({values[f.name]} AS {f.dataType.simpleString()}) AS `{f.name}`"
                for f in schema.fields
            ]
        )

    return apply


def is_retry_topic(topic: Column) -> Column:
    return topic.startswith(RETRY_PREFIX)


def stored_copies(messages: DataFrame) -> DataFrame:
    """Copies of messages as producers sent them: one row per copy, replicas collapsed.

    Retry, dead-letter and schedule copies carry the same UNIQ_KEY by design (the broker
    stores them on send-back or delay) and are left out: they are not resends. So is a copy
    that names another stored message as its origin (ORIGIN_MESSAGE_ID, which only the
    send-back sets, or mqaudit's DLQ replay as REPLAY_OF_PROPERTY, see messages.py): a dead
    letter replayed into its original topic. And so are the
    transaction units of the broker's own topics (a half message and its check-back
    re-appends): the committed unit in the real topic is the message's copy.
    """
    first_hand = messages.filter(
        ~F.col("is_retry")
        & ~F.col("is_dlq")
        & ~F.col("is_scheduled")
        & F.col("uniq_key").isNotNull()
        & F.col("queue_offset").isNotNull()
        # origin_msg_id is ORIGIN_MESSAGE_ID where set, else UNIQ_KEY
        & (F.col("origin_msg_id") == F.col("uniq_key"))
        & ~F.col("topic").isin(*TRANS_SYSTEM_TOPICS)
    )
    return first_hand.groupBy(*COPY, "topic", "queue_id", "queue_offset").agg(
        F.min("store_ts").alias("store_ts"),
        F.min("tags").alias("tags"),
        F.min("broker_id").alias("broker_id"),
    )


def queue_positions(messages: DataFrame) -> DataFrame:
    """Every stored message by queue position (any topic), replicas collapsed."""
    return (
        messages.filter(F.col("queue_offset").isNotNull())
        .groupBy(*QUEUE, "queue_offset")
        .agg(
            F.min("store_ts").alias("store_ts"),
            F.min_by("uniq_key", "store_ts").alias("uniq_key"),
        )
    )


def preferred_offsets(offsets: DataFrame) -> DataFrame:
    """One replica's consumer offset snapshots per broker group: the master's if it has any,
    with `group` for `consumer_group`. The audit job chooses them once per audit (jobs.audit);
    every transform that reads offsets takes what this returns.

    A slave's consumerOffset.json is a delayed copy of the master's; mixing both into one
    series would show offsets going back and forth that never did.
    """
    per_broker = Window.partitionBy(*BROKER).rowsBetween(
        Window.unboundedPreceding, Window.unboundedFollowing
    )
    return (
        offsets.withColumn("_chosen", F.min("broker_id").over(per_broker))
        .filter(F.col("broker_id") == F.col("_chosen"))
        .drop("_chosen")
        .withColumnRenamed("consumer_group", "group")
    )


def latest_offsets(offsets: DataFrame) -> DataFrame:
    """Per group and queue: the latest snapshot's committed offset and queue bounds
    (`offsets`: as preferred_offsets returns them)."""
    return offsets.groupBy("group", *QUEUE).agg(
        F.max("snapshot_ts").alias("snapshot_ts"),
        F.max_by("committed_offset", "snapshot_ts").alias("committed_offset"),
        F.max_by("min_offset", "snapshot_ts").alias("min_offset"),
        F.max_by("max_offset", "snapshot_ts").alias("max_offset"),
    )


def queue_min_offsets(offsets: DataFrame) -> DataFrame:
    """Per queue: its min offset at the latest snapshot (older offsets' files are deleted;
    `offsets`: as preferred_offsets returns them)."""
    chosen = offsets.filter(F.col("min_offset").isNotNull())
    return chosen.groupBy(*QUEUE).agg(
        F.max_by("min_offset", "snapshot_ts").alias("min_offset"),
    )


def below_min_offset() -> Column:
    """A row's queue position below its queue's `min_offset` (of `queue_min_offsets`): its
    file was deleted."""
    return F.col("min_offset").isNotNull() & (F.col("queue_offset") < F.col("min_offset"))


def position_text(broker: Column, topic: Column, queue_id: Column, offset: Column) -> Column:
    """`broker/topic/queue@offset`, how the audit rows name a queue position."""
    return F.format_string("%s/%s/%s@%s", broker, topic, queue_id, offset)


def undelivered_rows(
    df: DataFrame,
    msg_id: Column,
    kind: Column,
    cause: Column,
    detail: Column,
    first_ts: Column | None = None,
) -> DataFrame:
    """`audit_losses` rows (before `conform`) of messages a group never received: one per
    (message, group), with the queue position, the group's committed offset and the queue's
    min offset of `df`; first seen at `first_ts` (default: when stored), last when stored."""
    return df.select(
        msg_id.alias("msg_id"),
        "group",
        kind.alias("kind"),
        cause.alias("cause"),
        F.lit(1).cast("long").alias("count"),
        "topic",
        "cluster",
        "broker",
        "queue_id",
        "queue_offset",
        (F.col("store_ts") if first_ts is None else first_ts).alias("first_ts"),
        F.col("store_ts").alias("last_ts"),
        "committed_offset",
        "min_offset",
        detail.alias("detail"),
    )
