"""`audit_filters`: SQL92 subscriptions applied wrongly, judged by the broker's own evaluator.

A group's expression on a topic is the latest `consumer_filters` row of (cluster, broker,
topic, group) snapshotted by T (SQL92 only: RocketMQ keeps no tag subscriptions there). Each
message of that topic on that broker is judged by `broker_runtime.common.sql_filter`, the
evaluator the broker filters pulls with, over the properties stored with it: a Python UDF,
the one place the audit runs the broker's rule row by row (a second implementation in `F.*`
could only disagree with the broker's). An expression that does not compile judges nothing.

- `filtered_wrongly`, cause `delivered_but_excluded`: the group received a message (a first
  delivery: retries come back through %RETRY%{group}, which the broker does not filter) its
  expression does not match. count: such deliveries.
- `filtered_wrongly`, cause `matched_but_skipped`: a message its expression matches, stored
  after the broker registered the expression (`born_ts`: what a consumer could not have been
  filtering for earlier) and by T, below the group's committed offset in the latest snapshot,
  never delivered to the group, and not below its queue's min offset (below it, see next).
  count 1.

`expired_unreceived` gives the SQL92 groups' `expired_before_consumed` rows of `audit_losses`
(which leaves those groups to this module): a message the expression matches, stored after
it was registered, below its queue's min offset (its file was deleted), never delivered to
the group. Only messages the lake read before their file went can be judged: a confirmed
stub with no stored copy has no properties to apply the expression to.

Tag subscriptions are not judged: RocketMQ keeps a group's tags only in the broker's memory
(ConsumerManager), not in a file, so the lake has no record of what a tag group asked for; a
group's tags could only be guessed from what it received, and a wrong delivery is what the
audit would be looking for (audit_losses guesses them only to avoid reporting skips).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType

from broker_runtime.common import findings
from broker_runtime.common.constants import SQL92
from broker_runtime.common.sql_filter import SqlFilter, SqlFilterError, compile_sql
from pipeline import audit_schemas
from pipeline.transforms.audit_common import (
    QUEUE,
    below_min_offset,
    conform,
    latest_offsets,
    position_text,
    queue_min_offsets,
    undelivered_rows,
)

_KEY = ["cluster", "broker", "topic", "group"]


@functools.lru_cache(maxsize=1024)
def _compiled(expression: str) -> SqlFilter | None:
    try:
        return compile_sql(expression)
    except SqlFilterError:
        return None


def sql_matches(expression: str | None, properties: Mapping[str, str] | None) -> bool | None:
    """The broker's verdict on a message's properties; None when the expression is missing
    or does not compile."""
    compiled = _compiled(expression) if expression is not None else None
    return None if compiled is None else compiled.matches(properties or {})


# A lambda: PySpark 4 reads a function's type hints as a pandas UDF's and warns on these.
_MATCHES = F.udf(lambda expression, properties: sql_matches(expression, properties), BooleanType())


def group_expressions(filters: DataFrame, as_of_ms: int) -> DataFrame:
    """(cluster, broker, topic, group) -> its SQL92 expression and when the broker registered
    it, from the latest snapshot by T (a master's, where it has one)."""
    known = filters.filter(
        (F.col("snapshot_ts") <= as_of_ms) & (F.col("expression_type") == SQL92)
    ).withColumnRenamed("consumer_group", "group")
    order = Window.partitionBy(*_KEY).orderBy(F.col("snapshot_ts").desc(), F.col("broker_id"))
    return (
        known.withColumn("_n", F.row_number().over(order))
        .filter(F.col("_n") == 1)
        .select(*_KEY, "expression", F.col("born_ts").alias("registered_ts"))
    )


def _seen_by_sql_groups(log: DataFrame, expressions: DataFrame, as_of_ms: int) -> DataFrame:
    """The deliveries by T to the groups with an expression (from any topic: a retry comes
    back through %RETRY%{group}); most groups have none, and their deliveries are not read."""
    groups = expressions.select("cluster", "group").distinct()
    return log.filter(F.col("received_at") <= as_of_ms).join(
        groups, on=["cluster", "group"], how="left_semi"
    )


def _judged(messages: DataFrame, expressions: DataFrame, as_of_ms: int) -> DataFrame:
    """Every stored message of a filtered topic (replicas collapsed) with each of its groups'
    verdicts."""
    stored = messages.filter(
        F.col("queue_offset").isNotNull()
        & F.col("uniq_key").isNotNull()
        & (F.col("store_ts") <= as_of_ms)
    )
    one_copy = Window.partitionBy("cluster", "broker", "topic", "queue_id", "queue_offset")
    one_copy = one_copy.orderBy("broker_id")
    stored = stored.withColumn("_n", F.row_number().over(one_copy)).filter(F.col("_n") == 1)
    stored = stored.select(
        "cluster", "broker", "topic", "queue_id", "queue_offset", "uniq_key", "store_ts",
        "properties",
    )  # fmt: skip
    return stored.join(expressions, on=["cluster", "broker", "topic"], how="inner").select(
        *_KEY,
        "queue_id",
        "queue_offset",
        F.col("uniq_key").alias("msg_id"),
        "store_ts",
        "expression",
        "registered_ts",
        _MATCHES(F.col("expression"), F.col("properties")).alias("matches"),
    )


def _selected() -> Column:
    """A judged message the group's expression selects: it matches, and was stored after the
    broker registered the expression (a null, an error or false does not match)."""
    return F.coalesce(
        (F.col("matches") == F.lit(True)) & (F.col("store_ts") >= F.col("registered_ts")),
        F.lit(False),
    )


def not_selected(filters: DataFrame, messages: DataFrame, as_of_ms: int) -> DataFrame:
    """(cluster, group, msg_id) of the stored messages a SQL92 group's expression does not select:
    no other audit may expect them delivered to that group."""
    judged = _judged(messages, group_expressions(filters, as_of_ms), as_of_ms)
    return judged.filter(~_selected()).select("cluster", "group", "msg_id").distinct()


def _expected(judged: DataFrame, offsets: DataFrame) -> DataFrame:
    """The judged messages each group's expression matches, stored after it was registered,
    with `expired`: below the queue's min offset at the latest snapshot."""
    return (
        judged.filter(_selected())
        .join(queue_min_offsets(offsets), on=QUEUE, how="left")
        .withColumn("expired", below_min_offset())
    )


def _finding(cause: str, count: Column, committed: Column, detail: Column) -> list[Column]:
    return [
        F.lit(findings.FILTERED_WRONGLY).alias("kind"),
        F.lit(cause).alias("cause"),
        count.cast("long").alias("count"),
        committed.cast("long").alias("committed_offset"),
        detail.alias("detail"),
    ]


def audit_filters(
    filters: DataFrame, messages: DataFrame, log: DataFrame, offsets: DataFrame, as_of_ms: int
) -> DataFrame:
    """The `audit_filters` table. `messages` needs its `properties`; `log` RocketMQ's rows."""
    expressions = group_expressions(filters, as_of_ms)
    judged = _judged(messages, expressions, as_of_ms)
    seen = _seen_by_sql_groups(log, expressions, as_of_ms)
    first = (
        seen.filter(F.col("reconsume_times") == 0)
        .groupBy(*_KEY, "queue_id", "queue_offset", "msg_id")
        .agg(
            F.count(F.lit(1)).alias("deliveries"),
            F.min("received_at").alias("first_ts"),
            F.max("received_at").alias("last_ts"),
        )
    )
    where = position_text(F.col("broker"), F.col("topic"), F.col("queue_id"), F.col("queue_offset"))
    excluded = (
        judged.filter(F.col("matches") == F.lit(False))
        .join(first, on=[*_KEY, "queue_id", "queue_offset", "msg_id"], how="inner")
        .select(
            *_KEY,
            "queue_id",
            "queue_offset",
            "msg_id",
            "expression",
            "first_ts",
            "last_ts",
            *_finding(
                findings.DELIVERED_BUT_EXCLUDED,
                F.col("deliveries"),
                F.lit(None),
                F.format_string(
                    "%s delivered %d time(s); the group's expression does not match it",
                    where,
                    F.col("deliveries"),
                ),
            ),
        )
    )
    received = seen.select("cluster", "group", "msg_id").distinct()
    latest = latest_offsets(offsets).select(*_KEY, "queue_id", "committed_offset")
    skipped = (
        _expected(judged, offsets)
        .filter(~F.col("expired"))
        .join(latest, on=[*_KEY, "queue_id"], how="inner")
        .filter(F.col("queue_offset") < F.col("committed_offset"))
        .join(received, on=["cluster", "group", "msg_id"], how="left_anti")
        .select(
            *_KEY,
            "queue_id",
            "queue_offset",
            "msg_id",
            "expression",
            F.col("store_ts").alias("first_ts"),
            F.col("store_ts").alias("last_ts"),
            *_finding(
                findings.MATCHED_BUT_SKIPPED,
                F.lit(1),
                F.col("committed_offset"),
                F.format_string(
                    "%s matches the group's expression; its offset is at %d, no delivery",
                    where,
                    F.col("committed_offset"),
                ),
            ),
        )
    )
    return excluded.unionByName(skipped).transform(conform(audit_schemas.AUDIT_FILTERS, as_of_ms))


def expired_unreceived(
    filters: DataFrame, messages: DataFrame, log: DataFrame, offsets: DataFrame, as_of_ms: int
) -> DataFrame:
    """`audit_losses` rows: `expired_before_consumed` of the SQL92 groups (module doc)."""
    expressions = group_expressions(filters, as_of_ms)
    seen = _seen_by_sql_groups(log, expressions, as_of_ms)
    received = seen.select("cluster", "group", "msg_id").distinct()
    latest = latest_offsets(offsets).select(*_KEY, "queue_id", "committed_offset")
    where = position_text(F.col("broker"), F.col("topic"), F.col("queue_id"), F.col("queue_offset"))
    below = (  # only these are judged: most audits have none, and run no UDF for this
        messages.join(queue_min_offsets(offsets), on=QUEUE, how="inner")
        .filter(below_min_offset())
        .drop("min_offset")
    )
    return (
        _expected(_judged(below, expressions, as_of_ms), offsets)
        .filter(F.col("expired"))
        .join(received, on=["cluster", "group", "msg_id"], how="left_anti")
        .join(latest, on=[*_KEY, "queue_id"], how="left")
        .transform(
            lambda df: undelivered_rows(
                df,
                F.col("msg_id"),
                F.lit(findings.EXPIRED_BEFORE_CONSUMED),
                F.lit(findings.FILE_DELETED_BEFORE_DELIVERY),
                F.format_string(
                    "%s is below the queue's min offset %d; matches the group's expression, "
                    "never delivered to the group",
                    where,
                    F.col("min_offset"),
                ),
            )
        )
        .transform(conform(audit_schemas.AUDIT_LOSSES, as_of_ms))
    )
