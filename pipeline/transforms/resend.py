"""`resend_candidates` and `manual_handling`: the producer stubs the resend job acts on,
judged at the run's as-of time, never the wall clock.

A stub is a resend candidate when all of these hold:
1. it is UNCONFIRMED (the broker's acknowledgement never arrived);
2. its send_count is below `max_send_count`;
3. its resend time is due: next_resend_at <= as_of (the seed's "resendTime" already allows
   for the time a message may wait in the queue);
4. its offset is below the highest offset the consumers logged for its queue, so consumers
   have gone past where it would be; a stub that was never acknowledged has no offset, and
   then only the resend time guards against resending a message still waiting;
5. its msg id is not in the consumers' message log (then it arrived; nothing to resend).
Stubs at or past `max_send_count` that are still UNCONFIRMED go to `manual_handling`.
`by_system` judges each system's stubs against its own consumers' log (RabbitMQ stubs have no
offset: rule 4 holds for them, as for any stub never acknowledged).
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from broker_runtime.common import findings
from broker_runtime.ledger.schema import StubStatus
from pipeline import audit_schemas
from pipeline.transforms.audit_common import QUEUE, conform
from pipeline.transforms.rabbit import RABBITMQ, not_rabbitmq, of_rabbitmq

_STUB = [
    "msg_id",
    "topic",
    "tags",
    "keys",
    "body_hash",
    "cluster",
    "broker",
    "queue_id",
    "queue_offset",
    "send_count",
    "next_resend_at",
    "created_at",
    "updated_at",
]


def _unconfirmed(stubs: DataFrame, as_of_ms: int) -> DataFrame:
    return stubs.filter(
        (F.col("status") == StubStatus.UNCONFIRMED.value) & (F.col("created_at") <= as_of_ms)
    )


def _logged(log: DataFrame, stubs: DataFrame) -> DataFrame:
    """(cluster, msg_id) of the `stubs` that are in the consumers' log: only theirs are looked
    up (a few stubs, in a large log)."""
    keys = stubs.select("cluster", "msg_id").distinct()
    return (
        log.join(keys, on=["cluster", "msg_id"], how="left_semi")
        .select("cluster", "msg_id")
        .distinct()
    )


def resend_candidates(
    stubs: DataFrame, log: DataFrame, max_send_count: int, as_of_ms: int
) -> DataFrame:
    """The `resend_candidates` table (rules 1-5 above)."""
    max_logged = log.groupBy(*QUEUE).agg(F.max("queue_offset").alias("max_log_offset"))
    due = F.coalesce(F.col("next_resend_at"), F.col("created_at")) <= as_of_ms
    passed = F.col("queue_offset").isNull() | (F.col("queue_offset") < F.col("max_log_offset"))
    stubs = _unconfirmed(stubs, as_of_ms).filter((F.col("send_count") < max_send_count) & due)
    rows = (
        stubs.join(max_logged, on=QUEUE, how="left")
        .filter(passed)
        .join(_logged(log, stubs), on=["cluster", "msg_id"], how="left_anti")
    )
    cause = F.when(F.col("queue_offset").isNull(), findings.NEVER_ACKNOWLEDGED).otherwise(
        findings.OFFSET_PASSED_BY_CONSUMERS
    )
    return rows.select(
        *_STUB,
        "max_log_offset",
        F.lit(None).cast("string").alias("group"),
        F.lit(findings.RESEND_DUE).alias("kind"),
        cause.alias("cause"),
        F.col("send_count").cast("long").alias("count"),
    ).transform(conform(audit_schemas.RESEND_CANDIDATES, as_of_ms))


def manual_handling(
    stubs: DataFrame, log: DataFrame, max_send_count: int, as_of_ms: int
) -> DataFrame:
    """The `manual_handling` table: unconfirmed stubs the resend job may not send again."""
    stubs = _unconfirmed(stubs, as_of_ms).filter(F.col("send_count") >= max_send_count)
    logged = _logged(log, stubs).withColumn("in_message_log", F.lit(True))
    rows = stubs.join(logged, on=["cluster", "msg_id"], how="left")
    return rows.select(
        *_STUB,
        F.coalesce(F.col("in_message_log"), F.lit(False)).alias("in_message_log"),
        F.lit(None).cast("string").alias("group"),
        F.lit(findings.MAX_SEND_COUNT).alias("kind"),
        F.lit("send_count_at_max").alias("cause"),
        F.col("send_count").cast("long").alias("count"),
    ).transform(conform(audit_schemas.MANUAL_HANDLING, as_of_ms))


def by_system(
    table: Callable[[DataFrame, DataFrame, int, int], DataFrame],
    stubs: DataFrame,
    log: DataFrame,
    max_send_count: int,
    as_of_ms: int,
) -> DataFrame:
    """`resend_candidates` or `manual_handling` of every system's stubs, each judged against
    its own consumers' log, with its `system`."""
    rocketmq = table(not_rabbitmq(stubs), not_rabbitmq(log), max_send_count, as_of_ms)
    rabbitmq = table(of_rabbitmq(stubs), of_rabbitmq(log), max_send_count, as_of_ms)
    return rocketmq.unionByName(rabbitmq.withColumn("system", F.lit(RABBITMQ)))
