"""`audit_duplicates`: messages stored twice, and messages delivered to one group more than once
with the reason each extra delivery happened.

These rules are the one definition of a duplicate's cause: the workload's truth.json applies
them too (`broker_runtime.workload.truth.cause_of`, the same rules in Python over what its
consumers journaled). Each delivery after a group's first of a message (ordered by receipt)
is explained by the one before it, by the first rule that holds:
1. both came from the message's own topic, from different stored copies (queue positions):
   `producer_resend` (even when the one before failed: the resent copy
   is a delivery of its own, not a retry of the first);
2. the one before failed (RECONSUME_LATER / FAILED): `retry_after_failure`, as designed;
3. another client delivered the one before and still held the queue when this one came:
   on that queue (topic pulled from, broker, queue id) it was busy with a message it had
   received no later (finished at or after this receipt, or never), or it received another
   message from the queue after this receipt, no later than this client's last receipt
   there: `rebalance_overlap` (two owners of one queue at once, seeds 000 and 001). A client
   that got the queue back only after the other had left it is not counted;
4. the one before never finished (the consumer died holding it): `redelivery_after_restart`;
5. the one before was CONSUMED but its offset was not committed: `offset_not_committed`
   (also a handover where the old owner had let the queue go).
A group's row is `delivered_twice` when any extra delivery is not a retry, with the cause of
the first such; `retried_then_ok` when all extras were retries and the last one was CONSUMED.
Two or more CONSUMED outcomes add a `duplicate_effect` row: the work was done twice, where a
duplicate delivery alone may have been harmless (an idempotent consumer).
"""

from __future__ import annotations

from functools import reduce

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from broker_runtime.common import findings
from pipeline import audit_schemas
from pipeline.transforms.audit_common import (
    CONSUMED,
    FAILURES,
    conform,
    is_retry_topic,
    position_text,
    stored_copies,
)

_GROUP_MSG = ["cluster", "group", "msg_id"]
_ACTIVITY = ["cluster", "group", "broker", "topic", "queue_id", "client_id"]


def _with_two_or_more(df: DataFrame, key: list[str]) -> DataFrame:
    """The rows of `df` with no null in `key` whose `key` two or more rows share: one
    shuffle of `df` by the key (a count joined back to `df` computed and shuffled it twice)."""
    n = F.count(F.lit(1)).over(Window.partitionBy(*key))
    known = reduce(lambda a, b: a & b, [F.col(c).isNotNull() for c in key])
    return df.filter(known).withColumn("_n", n).filter(F.col("_n") >= 2).drop("_n")


def stored_twice(messages: DataFrame, copies: DataFrame | None = None) -> DataFrame:
    """UNIQ_KEYs with two or more stored copies in their topic (producer resend).
    `copies`: `stored_copies(messages)`, where the caller has it."""
    copies = stored_copies(messages) if copies is None else copies
    # Most keys have one copy: the lists and texts below are built for the others only.
    key = ["cluster", "topic", "uniq_key"]
    copies = _with_two_or_more(copies, key)
    where = position_text(F.col("broker"), F.col("topic"), F.col("queue_id"), F.col("queue_offset"))
    grouped = copies.groupBy(*key).agg(
        F.count(F.lit(1)).alias("count"),
        F.array_join(F.array_sort(F.collect_set("broker")), ",").alias("broker"),
        F.min_by(F.struct("queue_id", "queue_offset"), F.struct("store_ts", "phys_offset")).alias(
            "first"
        ),
        F.min("store_ts").alias("first_ts"),
        F.max("store_ts").alias("last_ts"),
        F.array_join(F.array_sort(F.collect_list(where)), ", ").alias("detail"),
    )
    return grouped.select(
        F.col("uniq_key").alias("msg_id"),
        F.lit(None).cast("string").alias("group"),
        F.lit(findings.STORED_TWICE).alias("kind"),
        F.lit(findings.PRODUCER_RESEND).alias("cause"),
        F.col("count"),
        F.col("topic"),
        F.col("cluster"),
        F.col("broker"),
        F.col("first.queue_id").alias("queue_id"),
        F.col("first.queue_offset").alias("queue_offset"),
        F.col("first_ts"),
        F.col("last_ts"),
        F.lit(None).cast("string").alias("clients"),
        F.lit(None).cast("long").alias("consumed"),
        F.concat(F.lit("copies at "), F.col("detail")).alias("detail"),
    )


def _overlaps(steps: DataFrame, log: DataFrame) -> DataFrame:
    """(cluster, id, overlap) for each delivery made by another client than the one before it.

    The previous client still held the queue when the duplicate arrived if, on that queue,
    it was busy with a message at that moment (received before, finished after), or it took
    another message from the queue afterwards while the duplicate's client was still taking
    messages from it. A client that got the queue back after the other had left is not
    counted. One window per client and queue over its deliveries plus these probe rows.
    """
    last_receipt = log.groupBy(*_ACTIVITY).agg(F.max("received_at").alias("d_last"))
    probes = (
        steps.filter(F.col("p_client_id") != F.col("client_id"))
        .join(last_receipt, on=_ACTIVITY, how="inner")
        .select(
            *[c for c in _ACTIVITY if c != "client_id"],
            F.col("p_client_id").alias("client_id"),
            F.col("received_at").alias("t"),
            F.lit(None).cast("long").alias("finish"),
            F.col("id").alias("probe"),
            "d_last",
        )
    )
    # Only the queues of the clients probed matter (the window is per client and queue).
    # There are at most as many as clients times queues: sent to each task whole, so the
    # log is filtered where it is read (a join would shuffle all of it first).
    probed = F.broadcast(probes.select(*_ACTIVITY).distinct())
    receipts = log.join(probed, on=_ACTIVITY, how="left_semi").select(
        *_ACTIVITY,
        F.col("received_at").alias("t"),
        F.coalesce("finished_at", "received_at").alias("finish"),
        F.lit(None).cast("long").alias("probe"),
        F.lit(None).cast("long").alias("d_last"),
    )
    # At equal times the client's own receipt sorts first: received then, busy then.
    order = Window.partitionBy(*_ACTIVITY).orderBy(F.col("t"), F.col("probe").asc_nulls_first())
    before = order.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    # "This row and all after it" as a running frame over the reverse order: Spark recomputes
    # an UNBOUNDED FOLLOWING frame for every row (quadratic in a client's deliveries).
    reverse = Window.partitionBy(*_ACTIVITY).orderBy(
        F.col("t").desc(), F.col("probe").desc_nulls_last()
    )
    after = reverse.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    marked = receipts.unionByName(probes).withColumns(
        {
            "busy_until": F.max("finish").over(before),
            "next_receipt": F.min(F.when(F.col("probe").isNull(), F.col("t"))).over(after),
        }
    )
    overlap = (F.col("busy_until") >= F.col("t")) | (F.col("next_receipt") <= F.col("d_last"))
    return marked.filter(F.col("probe").isNotNull()).select(
        "cluster", F.col("probe").alias("id"), F.coalesce(overlap, F.lit(False)).alias("overlap")
    )


def explain_deliveries(log: DataFrame, receipts: DataFrame | None = None) -> DataFrame:
    """Every delivery of `log` with its number within (group, msg_id) and, from the 2nd on,
    its cause. `receipts`: every delivery of the consumers (default `log`), when `log` holds
    only some messages' deliveries (whole, per group): a client's other receipts decide
    whether it still held a queue."""
    order = Window.partitionBy(*_GROUP_MSG).orderBy(F.col("received_at"), F.col("id"))
    prev = {f"p_{c}": F.lag(c).over(order) for c in ("outcome", "client_id", "topic")}
    prev["p_position"] = F.lag(F.struct("broker", "topic", "queue_id", "queue_offset")).over(order)
    steps = log.withColumns({"seq": F.row_number().over(order), **prev})
    # A ledger row is (cluster, id): each cluster's ledger numbers its rows from 1.
    overlaps = _overlaps(steps, log if receipts is None else receipts)
    steps = steps.join(overlaps, on=["cluster", "id"], how="left")
    position = F.struct("broker", "topic", "queue_id", "queue_offset")
    other_copy = (
        ~is_retry_topic(F.col("topic"))
        & ~is_retry_topic(F.col("p_topic"))
        & (position != F.col("p_position"))
    )
    cause = (
        F.when(F.col("seq") == 1, F.lit(None).cast("string"))
        .when(other_copy, findings.PRODUCER_RESEND)
        .when(F.col("p_outcome").isin(FAILURES), findings.RETRY_AFTER_FAILURE)
        .when(F.col("overlap"), findings.REBALANCE_OVERLAP)
        .when(F.col("p_outcome").isNull(), findings.REDELIVERY_AFTER_RESTART)
        .otherwise(findings.OFFSET_NOT_COMMITTED)
    )
    return steps.withColumn("cause", cause).select(*log.columns, "seq", "cause")


def repeated_deliveries(log: DataFrame) -> DataFrame:
    """The deliveries of the messages a group received more than once: the only ones with an
    extra delivery to explain (few, in a large log). The audit job keeps them in memory:
    `delivered_twice` reads them three times."""
    return _with_two_or_more(log, _GROUP_MSG)


def delivered_twice(log: DataFrame, repeated: DataFrame | None = None) -> DataFrame:
    """Per (group, msg_id) delivered more than once: delivered_twice / retried_then_ok rows,
    plus duplicate_effect rows where two or more deliveries were CONSUMED. `repeated`:
    `repeated_deliveries(log)`, where the caller keeps it."""
    if repeated is None:
        repeated = repeated_deliveries(log)
    steps = explain_deliveries(repeated, receipts=log)
    extra = F.col("seq") > 1
    not_retry = extra & (F.col("cause") != findings.RETRY_AFTER_FAILURE)
    per_msg = steps.groupBy(*_GROUP_MSG).agg(
        F.count(F.lit(1)).alias("count"),
        F.sum(F.when(F.col("outcome") == CONSUMED, 1).otherwise(0)).cast("long").alias("consumed"),
        F.min_by(F.struct("topic", "broker", "queue_id", "queue_offset"), F.col("seq")).alias(
            "first"
        ),
        F.min("received_at").alias("first_ts"),
        F.max("received_at").alias("last_ts"),
        F.array_join(F.array_sort(F.collect_set("client_id")), ",").alias("clients"),
        F.sort_array(F.collect_list(F.when(not_retry, F.struct("seq", "cause")))).alias("causes"),
        F.max(extra & (F.col("cause") == findings.RETRY_AFTER_FAILURE)).alias("retried"),
        F.max_by("outcome", "seq").alias("last_outcome"),
        F.array_join(
            F.transform(
                F.sort_array(F.collect_list(F.when(extra, F.struct("seq", "cause")))),
                lambda s: F.format_string("#%d %s", s["seq"], s["cause"]),
            ),
            ", ",
        ).alias("steps"),
    )
    kind = (
        F.when(F.size("causes") > 0, findings.DELIVERED_TWICE)
        .when(F.col("retried") & (F.col("last_outcome") == CONSUMED), findings.RETRIED_THEN_OK)
        .otherwise(F.lit(None).cast("string"))
    )
    cause = F.when(F.size("causes") > 0, F.col("causes")[0]["cause"]).otherwise(
        findings.RETRY_AFTER_FAILURE
    )
    # A message CONSUMED twice or more gives a second row, its duplicate_effect: one pass
    # over the windows for both kinds (a union of the two would run them twice).
    effect = F.col("consumed") >= 2
    kinds = F.when(effect, F.array("kind", F.lit(findings.DUPLICATE_EFFECT))).otherwise(
        F.array("kind")
    )
    detail = F.format_string("%d deliveries: %s", F.col("count"), F.col("steps"))
    is_effect = F.col("kind") == findings.DUPLICATE_EFFECT
    return (
        per_msg.filter(F.col("count") >= 2)
        .withColumns({"kind": kind, "cause": cause})
        .filter(F.col("kind").isNotNull())
        .withColumn("kind", F.explode(kinds))
        .select(
            "msg_id",
            "group",
            "kind",
            "cause",
            F.when(is_effect, F.col("consumed"))
            .otherwise(F.col("count"))
            .cast("long")
            .alias("count"),
            F.col("first.topic").alias("topic"),
            "cluster",
            F.col("first.broker").alias("broker"),
            F.col("first.queue_id").alias("queue_id"),
            F.col("first.queue_offset").alias("queue_offset"),
            "first_ts",
            "last_ts",
            "clients",
            "consumed",
            F.when(is_effect, F.format_string("CONSUMED %d times; %s", F.col("consumed"), detail))
            .otherwise(detail)
            .alias("detail"),
        )
    )


def audit_duplicates(
    messages: DataFrame,
    log: DataFrame,
    as_of_ms: int,
    *,
    copies: DataFrame | None = None,
    repeated: DataFrame | None = None,
) -> DataFrame:
    """The `audit_duplicates` table; `copies`, `repeated`: see `stored_twice`,
    `delivered_twice`."""
    return (
        stored_twice(messages, copies)
        .unionByName(delivered_twice(log, repeated))
        .transform(conform(audit_schemas.AUDIT_DUPLICATES, as_of_ms))
    )
