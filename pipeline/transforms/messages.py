"""Raw commitlog rows -> the `messages` table: properties parsed, ids, hosts and retry / DLQ /
schedule lineage resolved, by the same names and rules the broker routes by."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from broker_runtime.common.message import (
    DELAY,
    KEYS,
    ORIGIN_MESSAGE_ID,
    REAL_TOPIC,
    REPLAY_OF_PROPERTY,
    RETRY_TOPIC,
    TAGS,
    UNIQ_KEY,
)
from broker_runtime.common.topics import DLQ_PREFIX, RETRY_PREFIX, SCHEDULE_TOPIC
from pipeline.schemas import MESSAGES

_MAX_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z: beyond it no date exists
_DAY_MS = 86_400_000


def _group_of(topic: Column) -> Column:
    return (
        F.when(topic.startswith(RETRY_PREFIX), F.substring(topic, len(RETRY_PREFIX) + 1, 1 << 20))
        .when(topic.startswith(DLQ_PREFIX), F.substring(topic, len(DLQ_PREFIX) + 1, 1 << 20))
        .otherwise(F.lit(None).cast("string"))
    )


def to_messages(raw: DataFrame, run: int, cluster: str) -> DataFrame:
    """RAW_MESSAGE rows of brokers of `cluster` -> MESSAGES rows (a select in the table's
    column order)."""
    props = F.col("properties")
    prop = props.getItem
    delivery = F.when(
        F.col("topic") == SCHEDULE_TOPIC, F.coalesce(prop(REAL_TOPIC), F.col("topic"))
    )
    delivery = delivery.otherwise(F.col("topic"))
    store_ts = F.col("store_ts")
    # The UTC day of the store time; null for a time no calendar has (a damaged header).
    store_date = F.when(
        store_ts.between(0, _MAX_MS),
        F.date_from_unix_date(F.floor(store_ts / _DAY_MS).cast("int")),
    )
    df = raw.withColumn("delivery_topic", delivery)
    columns = {
        "uniq_key": prop(UNIQ_KEY),
        "keys": prop(KEYS),
        "tags": prop(TAGS),
        "original_topic": F.coalesce(prop(RETRY_TOPIC), prop(REAL_TOPIC), F.col("topic")),
        # The copy it derives from: the broker's send-back names it, and so does mqaudit's
        # DLQ replay (the dead-letter copy it sent back), else the message is its own origin.
        "origin_msg_id": F.coalesce(
            prop(ORIGIN_MESSAGE_ID), prop(REPLAY_OF_PROPERTY), prop(UNIQ_KEY)
        ),
        "consumer_group": _group_of(F.col("delivery_topic")),
        "is_retry": F.col("delivery_topic").startswith(RETRY_PREFIX),
        "is_dlq": F.col("delivery_topic").startswith(DLQ_PREFIX),
        "is_scheduled": F.col("topic") == SCHEDULE_TOPIC,
        "delay_level": prop(DELAY).try_cast("int"),
        "ingest_run": F.lit(run).cast("long"),
        "store_date": store_date,
        "cluster": F.lit(cluster),
    }
    return df.withColumns(columns).select(*[f.name for f in MESSAGES.fields])
