"""RabbitMQ's audit rules: pure DataFrame -> DataFrame, rows for the existing audit tables.

Inputs are the RabbitMQ rows of the ledgers (`system` rabbitmq: a stub's `topic` is the
exchange and `broker` the virtual host; a log row's `group` is the queue), the queues each
confirmed publish had to reach (`routes`: msg_id, queue, with the settings of that queue in
the topology of its time) and the run's clock. A finding's `group` is the queue and its
`topic` the exchange.

- audit_duplicates: a message delivered more than once from one queue: `delivered_twice`,
  caused by a requeue (nack/reject with requeue), a redelivery after the consumer went away
  with it unacknowledged (`redelivery_after_restart`), or a second publish of the same
  message id (`producer_resend`); `duplicate_effect` when two deliveries were acked.
- audit_losses: a returned mandatory publish is `unroutable`; a queue the routing required
  that logged no delivery of the message, and did not dead-letter it, lost it: `expired`
  when the queue has a message TTL the message outlived, `dropped_maxlen` when it has a
  length limit that drops (drop-head), else `never_delivered` (not_consumed).
- audit_dead_letters: deliveries carrying `x-death` (a consumer of the dead-letter queue
  logged them): `dead_lettered` from the queue of the newest death (`group`), with its
  reason (rejected, expired, maxlen, delivery_limit) as the cause; `topic` is the exchange
  it was dead-lettered through, `original_topic` the exchange it was first published to,
  `death` the whole x-death history (with the original routing keys); `replayed` once a
  RabbitMQ replay (pipeline.jobs.replay, `system` rabbitmq) sent it back.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, MapType, StringType

from broker_runtime.common import findings
from pipeline import audit_schemas
from pipeline.transforms.audit_common import conform
from pipeline.transforms.dead_letters import replays

RABBITMQ = findings.RABBITMQ
CONSUMED = "CONSUMED"


def _null(kind: str) -> Column:
    return F.lit(None).cast(kind)


_DEATH = ArrayType(MapType(StringType(), StringType()))


def of_rabbitmq(df: DataFrame) -> DataFrame:
    return df.filter(F.col("system") == RABBITMQ)


def not_rabbitmq(df: DataFrame) -> DataFrame:
    """RocketMQ's rows (rows ingested before `system` existed are RocketMQ's)."""
    return df.filter(F.coalesce(F.col("system"), F.lit(findings.ROCKETMQ)) != RABBITMQ)


def newest_death(log: DataFrame) -> DataFrame:
    """Log rows with x-death, and its newest entry's queue, reason, exchange, routing keys."""
    death = F.from_json(F.col("death"), _DEATH)[0]
    keys = F.from_json(death["routing-keys"], ArrayType(StringType()))
    return log.filter(F.col("death").isNotNull()).withColumns(
        {
            "dead_queue": death["queue"],
            "reason": death["reason"],
            "dead_exchange": death["exchange"],
            "dead_keys": F.array_join(keys, ","),
            "dead_count": death["count"].cast("long"),
        }
    )


def rabbit_duplicates(log: DataFrame, as_of_ms: int) -> DataFrame:
    rows = of_rabbitmq(log).filter(F.col("received_at") <= as_of_ms)
    requeued = (F.col("settle") != "ack") & F.col("requeue")
    per = rows.groupBy("cluster", "msg_id", "group").agg(
        F.count(F.lit(1)).cast("long").alias("count"),
        F.sum(F.when(F.col("outcome") == CONSUMED, 1).otherwise(0)).cast("long").alias("consumed"),
        F.max(F.coalesce(F.col("redelivered"), F.lit(False))).alias("any_redelivered"),
        F.max(F.coalesce(requeued, F.lit(False))).alias("any_requeued"),
        F.min_by(F.struct("topic", "broker"), F.col("id")).alias("first"),
        F.min("received_at").alias("first_ts"),
        F.max("received_at").alias("last_ts"),
        F.array_join(F.array_sort(F.collect_set("client_id")), ",").alias("clients"),
        F.array_join(
            F.transform(
                F.array_sort(F.collect_list(F.struct("id", "redelivered", "settle", "outcome"))),
                lambda r: F.format_string(
                    "%s%s", F.coalesce(r["settle"], F.lit("unsettled")),
                    F.when(r["redelivered"], F.lit(" (redelivered)")).otherwise(F.lit("")),
                ),
            ),
            ", ",
        ).alias("steps"),
    )  # fmt: skip
    cause = (
        F.when(~F.col("any_redelivered"), F.lit(findings.PRODUCER_RESEND))
        .when(F.col("any_requeued"), F.lit(findings.REQUEUED))
        .otherwise(F.lit(findings.REDELIVERY_AFTER_RESTART))
    )
    twice = per.filter(F.col("count") >= 2).select(
        "msg_id",
        "group",
        F.lit(findings.DELIVERED_TWICE).alias("kind"),
        cause.alias("cause"),
        "count",
        F.col("first.topic").alias("topic"),
        "cluster",
        F.col("first.broker").alias("broker"),
        _null("int").alias("queue_id"),
        _null("long").alias("queue_offset"),
        "first_ts",
        "last_ts",
        "clients",
        "consumed",
        F.format_string("%d deliveries: %s", F.col("count"), F.col("steps")).alias("detail"),
        F.lit(RABBITMQ).alias("system"),
    )
    effects = twice.filter(F.col("consumed") >= 2).withColumns(
        {
            "kind": F.lit(findings.DUPLICATE_EFFECT),
            "count": F.col("consumed"),
            "detail": F.format_string("acked %d times; %s", F.col("consumed"), F.col("detail")),
        }
    )
    return twice.unionByName(effects).transform(conform(audit_schemas.AUDIT_DUPLICATES, as_of_ms))


def _loss(kind: Column, cause: Column, detail: Column) -> list[Column]:
    return [
        kind.alias("kind"),
        cause.alias("cause"),
        F.lit(1).cast("long").alias("count"),
        _null("int").alias("queue_id"),
        _null("long").alias("queue_offset"),
        _null("long").alias("committed_offset"),
        _null("long").alias("min_offset"),
        detail.alias("detail"),
        F.lit(RABBITMQ).alias("system"),
    ]


def rabbit_losses(stubs: DataFrame, routes: DataFrame, log: DataFrame, as_of_ms: int) -> DataFrame:
    """`routes`: msg_id, queue, message_ttl, max_length, overflow, dead_letter_exchange."""
    stubs = of_rabbitmq(stubs).filter(F.col("created_at") <= as_of_ms)
    unroutable = stubs.filter(F.col("return_reason").isNotNull()).select(
        "msg_id",
        _null("string").alias("group"),
        F.col("topic"),
        F.col("cluster"),
        F.col("broker"),
        F.col("created_at").alias("first_ts"),
        F.col("updated_at").alias("last_ts"),
        *_loss(
            F.lit(findings.UNROUTABLE),
            F.lit(findings.NO_ROUTE),
            F.format_string(
                "returned (%s): exchange '%s', routing key '%s'",
                F.col("return_reason"), F.col("topic"), F.coalesce(F.col("routing_key"), F.lit("")),
            ),
        ),
    )  # fmt: skip
    rows = of_rabbitmq(log).filter(F.col("received_at") <= as_of_ms)
    delivered = rows.select("cluster", "msg_id", F.col("group").alias("queue")).distinct()
    dead = newest_death(rows).select("cluster", "msg_id", F.col("dead_queue").alias("queue"))
    confirmed = stubs.filter(
        (F.col("status") == "CONFIRMED") & F.col("return_reason").isNull()
    ).select("cluster", "msg_id", "topic", "broker", "routing_key", "created_at")
    missing = (
        routes.join(confirmed, on="msg_id", how="inner")
        .join(delivered, on=["cluster", "msg_id", "queue"], how="left_anti")
        .join(dead.distinct(), on=["cluster", "msg_id", "queue"], how="left_anti")
    )
    outlived = F.col("message_ttl").isNotNull() & (
        F.col("created_at") + F.col("message_ttl") <= as_of_ms
    )
    drops = F.col("max_length").isNotNull() & (
        F.coalesce(F.col("overflow"), F.lit("drop-head")) == "drop-head"
    )
    kind = (
        F.when(outlived, F.lit(findings.EXPIRED))
        .when(drops, F.lit(findings.DROPPED_MAXLEN))
        .otherwise(F.lit(findings.NEVER_DELIVERED))
    )
    cause = (
        F.when(outlived, F.lit(findings.MESSAGE_TTL))
        .when(drops, F.lit(findings.MAX_LENGTH))
        .otherwise(F.lit(findings.NOT_CONSUMED))
    )
    lost = missing.select(
        "msg_id",
        F.col("queue").alias("group"),
        "topic",
        "cluster",
        "broker",
        F.col("created_at").alias("first_ts"),
        F.col("created_at").alias("last_ts"),
        *_loss(
            kind,
            cause,
            F.format_string(
                "routed by exchange '%s' (key '%s') to queue '%s', never delivered from it",
                F.col("topic"), F.coalesce(F.col("routing_key"), F.lit("")), F.col("queue"),
            ),
        ),
    )  # fmt: skip
    return unroutable.unionByName(lost).transform(conform(audit_schemas.AUDIT_LOSSES, as_of_ms))


def rabbit_dead_letters(log: DataFrame, as_of_ms: int, replay_log: DataFrame) -> DataFrame:
    """`replay_log`: `dlq_replay_log` (its RabbitMQ rows mark what a replay sent)."""
    rows = newest_death(of_rabbitmq(log).filter(F.col("received_at") <= as_of_ms))
    per = rows.groupBy("cluster", "msg_id", "dead_queue").agg(
        F.min_by(
            F.struct("reason", "topic", "dead_exchange", "dead_count", "broker", "death"),
            F.col("id"),
        ).alias("d"),
        F.min("received_at").alias("first_ts"),
        F.max("received_at").alias("last_ts"),
        F.count(F.lit(1)).cast("long").alias("deliveries"),
        F.max_by("outcome", "id").alias("last_outcome"),
    )
    done = replays(of_rabbitmq(replay_log)).withColumnRenamed("group", "dead_queue")
    per = per.join(done, on=["cluster", "dead_queue", "msg_id"], how="left")
    cause = F.when(F.col("d.reason").isin(*findings.DEATH_REASONS), F.col("d.reason")).otherwise(
        F.lit("other")
    )
    return per.select(
        "msg_id",
        F.col("dead_queue").alias("group"),
        F.lit(findings.DEAD_LETTERED).alias("kind"),
        cause.alias("cause"),
        F.lit(1).cast("long").alias("count"),
        F.col("d.topic").alias("topic"),
        "cluster",
        F.col("d.broker").alias("broker"),
        _null("int").alias("queue_id"),
        _null("long").alias("queue_offset"),
        F.col("d.dead_exchange").alias("original_topic"),
        _null("string").alias("origin_msg_id"),
        "first_ts",
        "last_ts",
        (F.lit(as_of_ms) - F.col("first_ts")).alias("age_ms"),
        F.col("d.dead_count").cast("int").alias("retries"),
        F.lit(None)
        .cast(audit_schemas.AUDIT_DEAD_LETTERS["retry_chain"].dataType)
        .alias("retry_chain"),
        "deliveries",
        "last_outcome",
        F.coalesce(F.col("replayed"), F.lit(False)).alias("replayed"),
        "replay_status",
        "replayed_at",
        F.lit(RABBITMQ).alias("system"),
        F.col("d.death").alias("death"),
    ).transform(conform(audit_schemas.AUDIT_DEAD_LETTERS, as_of_ms))
