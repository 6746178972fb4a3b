"""The `messages` table's transactional units -> the `transactions` table, one row per
transaction (broker, producer group, UNIQ_KEY), as RocketMQ 4.9's broker leaves them:

- half units in RMQ_SYS_TRANS_HALF_TOPIC: the first one the producer sent, then one more per
  check-back (its TRANSACTION_CHECK_TIMES raised); REAL_TOPIC / REAL_QID name the real queue;
- op units in RMQ_SYS_TRANS_OP_HALF_TOPIC (tag "d"): the body is the queue offset of the half
  unit a commit or rollback ended;
- committed units in the real topic: COMMIT sysflag, preparedTransactionOffset = the log
  offset of the half unit committed;
- a unit in TRANS_CHECK_MAX_TIME_TOPIC: the check gave up on it (`gave_up_ts`, the latest);
  a half unit stored after it means an admin put it back under checking (`mqaudit admin
  resume-check`): the transaction is pending again.

A commit writes an op unit too, so an op without a committed unit is a rollback. Two half
sends with one UNIQ_KEY and group are taken as one transaction (a producer never does that).
Replicas are collapsed: a master and its slaves hold a unit at the same log offset.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from broker_runtime.common import findings
from broker_runtime.common.message import (
    PRODUCER_GROUP,
    REAL_QUEUE_ID,
    REAL_TOPIC,
    TRANSACTION_CHECK_TIMES,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_MASK,
)
from broker_runtime.common.topics import (
    TRANS_CHECK_MAX_TIME_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
    TRANS_OP_REMOVE_TAG,
    TRANS_SYSTEM_TOPICS,
)
from pipeline.schemas import TRANSACTIONS

TX_KEY = ["cluster", "broker", "producer_group", "uniq_key"]


def is_commit_unit(sys_flag: Column, topic: Column) -> Column:
    """A unit a commit wrote to the real topic (COMMIT transaction type in its sysflag)."""
    committed = sys_flag.bitwiseAND(TRANSACTION_MASK) == TRANSACTION_COMMIT_TYPE
    # Implied by the mask, and unlike it a filter parquet takes: a row group whose sysflags
    # are all below COMMIT (no transactional unit in it) is skipped by its statistics.
    at_least = sys_flag >= TRANSACTION_COMMIT_TYPE
    return at_least & committed & ~topic.isin(*TRANS_SYSTEM_TOPICS)


def count_units(batch: pa.RecordBatch) -> int:
    """The transactional units among a MESSAGES batch's rows, as `_units` takes them (a
    system topic's, or a commit's in a real topic), counted where the ingest decodes them: a
    run that read none leaves the `transactions` table as it was."""
    system = pc.is_in(batch.column("topic"), pa.array(TRANS_SYSTEM_TOPICS))
    flag = pc.bit_wise_and(batch.column("sys_flag"), TRANSACTION_MASK)
    committed = pc.equal(flag, TRANSACTION_COMMIT_TYPE)
    return int(pc.sum(pc.or_kleene(system, committed)).as_py() or 0)


def _unit(text: bool) -> Column:
    """A unit's fields; the body and the properties only if `text` (else nulls)."""

    def kept(value: Column) -> Column:
        return value if text else F.lit(None).cast("string")

    return F.struct(
        "topic",
        "queue_id",
        "queue_offset",
        "uniq_key",
        "keys",
        "tags",
        "born_ts",
        "store_ts",
        "sys_flag",
        "prepared_tx_offset",
        kept(F.col("body").cast("string")).alias("body_text"),
        kept(F.col("properties").getItem(PRODUCER_GROUP)).alias("producer_group"),
        kept(F.col("properties").getItem(REAL_TOPIC)).alias("real_topic"),
        kept(F.col("properties").getItem(REAL_QUEUE_ID)).try_cast("int").alias("real_qid"),
        kept(F.col("properties").getItem(TRANSACTION_CHECK_TIMES)).try_cast("int").alias("checks"),
    )


def _units(messages: DataFrame) -> DataFrame:
    """The transactional units, one row per stored unit (the lowest broker id's replica).

    Only the system topics' units need their bodies and properties, and a filter on the topic
    alone lets the parquet reader skip every row group without one (by its dictionary): the
    1 KiB bodies of the other messages are never decoded. A committed unit in a real topic
    needs its narrow columns only."""
    system = messages.filter(F.col("topic").isin(*TRANS_SYSTEM_TOPICS))
    committed = messages.filter(is_commit_unit(F.col("sys_flag"), F.col("topic")))
    keys = ["cluster", "broker", "phys_offset", "broker_id"]
    return (
        system.select(*keys, _unit(True).alias("u"))
        .unionByName(committed.select(*keys, _unit(False).alias("u")))
        .groupBy("cluster", "broker", "phys_offset")
        .agg(F.min_by("u", "broker_id").alias("u"))
        .select("cluster", "broker", "phys_offset", "u.*")
    )


def transactions_table(messages: DataFrame, run: int) -> DataFrame:
    """MESSAGES rows -> TRANSACTIONS rows (a select in the table's column order). The units
    are computed once, here (each of their five uses below would scan `messages` again)."""
    units = _units(messages).localCheckpoint()
    halves = units.filter(
        (F.col("topic") == TRANS_HALF_TOPIC) & F.col("uniq_key").isNotNull()
    ).withColumn("producer_group", F.coalesce(F.col("producer_group"), F.lit("")))
    first = F.struct(
        F.col("real_topic").alias("topic"),
        F.col("real_qid").alias("queue_id"),
        F.col("queue_offset").alias("half_queue_offset"),
        F.col("phys_offset").alias("half_phys_offset"),
        "keys",
        "born_ts",
    )
    tx = halves.groupBy(*TX_KEY).agg(
        F.min_by(first, "phys_offset").alias("first"),
        F.count(F.lit(1)).cast("int").alias("half_units"),
        F.coalesce(F.max("checks"), F.lit(0)).cast("int").alias("checks"),
        F.min("store_ts").alias("half_ts"),
        F.max("store_ts").alias("last_half_ts"),
    )
    index = halves.select(
        *TX_KEY, F.col("queue_offset").alias("half_qo"), F.col("phys_offset").alias("half_po")
    )
    ops = (
        units.filter(
            (F.col("topic") == TRANS_OP_HALF_TOPIC) & (F.col("tags") == TRANS_OP_REMOVE_TAG)
        )
        .select(
            "cluster", "broker", F.col("body_text").try_cast("long").alias("half_qo"), "store_ts"
        )
        .join(index, on=["cluster", "broker", "half_qo"], how="inner")
        .groupBy(*TX_KEY)
        .agg(F.count(F.lit(1)).cast("int").alias("ops"), F.min("store_ts").alias("op_ts"))
    )
    commits = (
        units.filter(is_commit_unit(F.col("sys_flag"), F.col("topic")))
        .select(
            "cluster",
            "broker",
            F.col("prepared_tx_offset").alias("half_po"),
            "store_ts",
            "queue_offset",
        )
        .join(index, on=["cluster", "broker", "half_po"], how="inner")
        .groupBy(*TX_KEY)
        .agg(
            F.count(F.lit(1)).cast("int").alias("commits"),
            F.count_distinct("half_po").cast("int").alias("commit_offsets"),
            F.min("store_ts").alias("commit_ts"),
            F.min_by("queue_offset", "store_ts").alias("commit_queue_offset"),
        )
    )
    gave_up = (
        units.filter(F.col("topic") == TRANS_CHECK_MAX_TIME_TOPIC)
        .withColumn("producer_group", F.coalesce(F.col("producer_group"), F.lit("")))
        .groupBy(*TX_KEY)
        .agg(F.max("store_ts").alias("gave_up_ts"))
    )
    rows = (
        tx.join(ops, on=TX_KEY, how="left")
        .join(commits, on=TX_KEY, how="left")
        .join(gave_up, on=TX_KEY, how="left")
        .withColumns(
            {
                "ops": F.coalesce(F.col("ops"), F.lit(0)),
                "commits": F.coalesce(F.col("commits"), F.lit(0)),
                "commit_offsets": F.coalesce(F.col("commit_offsets"), F.lit(0)),
            }
        )
    )
    state = tx_state(
        F.col("commit_ts").isNotNull(),
        F.col("op_ts").isNotNull(),
        F.col("gave_up_ts") >= F.col("last_half_ts"),
    )
    return rows.select(
        *TX_KEY,
        "first.keys",
        "first.topic",
        "first.queue_id",
        "first.half_queue_offset",
        "first.half_phys_offset",
        "half_units",
        "checks",
        "first.born_ts",
        "half_ts",
        "last_half_ts",
        "ops",
        "op_ts",
        "commits",
        "commit_offsets",
        "commit_ts",
        "commit_queue_offset",
        "gave_up_ts",
        state.alias("state"),
        F.lit(run).cast("long").alias("ingest_run"),
    ).select(*[F.col(f.name).cast(f.dataType) for f in TRANSACTIONS.fields])


def tx_state(committed: Column, ended: Column, gave_up: Column) -> Column:
    """committed, else rolled_back (an op without a commit), else gave_up, else pending."""
    return (
        F.when(committed, findings.TX_COMMITTED)
        .when(ended, findings.TX_ROLLED_BACK)
        .when(F.coalesce(gave_up, F.lit(False)), findings.TX_GAVE_UP)
        .otherwise(findings.TX_PENDING)
    )
