"""The lake's catalog: every Delta table's name, schema, partitioning, key and path.

Readers, writers, gates, reports and the remediation jobs look tables up here; the column
contracts themselves are in `pipeline.schemas` (ingested tables) and
`pipeline.audit_schemas` (audit and remediation tables). A table lives at LAKE/<name>.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pyspark.sql.types import StructType

from broker_runtime.common.findings import ROCKETMQ
from broker_runtime.common.topics import validate_group
from pipeline import audit_schemas, schemas

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

Layer = Literal["ingested", "audit", "remediation"]


@dataclass(frozen=True)
class Table:
    """One table of the lake. `key` is what makes a row unique (the gates check it)."""

    name: str
    schema: StructType
    layer: Layer
    partitions: tuple[str, ...] = ()
    key: tuple[str, ...] = ()

    def path(self, lake: str | Path) -> str:
        return table_path(lake, self.name)


def table_path(lake: str | Path, name: str) -> str:
    """Where table `name` lives in the lake."""
    return f"{str(lake).rstrip('/')}/{name}"


_CATALOG = (
    Table(
        "messages",
        schemas.MESSAGES,
        "ingested",
        partitions=("broker", "store_date"),
        key=("cluster", "broker", "broker_id", "phys_offset"),
    ),
    Table(
        "consume_queue",
        schemas.CONSUME_QUEUE,
        "ingested",
        partitions=("broker",),
        key=("cluster", "broker", "broker_id", "topic", "queue_id", "queue_offset"),
    ),
    Table(
        "consumer_offsets",
        schemas.CONSUMER_OFFSETS,
        "ingested",
        key=(
            "cluster",
            "broker",
            "broker_id",
            "snapshot_ts",
            "topic",
            "consumer_group",
            "queue_id",
        ),
    ),
    Table("message_stub", schemas.MESSAGE_STUB, "ingested", key=("cluster", "msg_id")),
    Table("message_log", schemas.MESSAGE_LOG, "ingested", key=("cluster", "id")),
    Table(
        "quarantine",
        schemas.QUARANTINE,
        "ingested",
        key=("cluster", "broker", "broker_id", "log_offset", "reason"),
    ),
    Table("ingest_checkpoint", schemas.INGEST_CHECKPOINT, "ingested"),
    Table(
        "rabbit_topology",
        schemas.RABBIT_TOPOLOGY,
        "ingested",
        key=("vhost", "snapshot_ts", "kind", "name"),
    ),
    Table(
        "transactions",
        schemas.TRANSACTIONS,
        "ingested",
        key=("cluster", "broker", "producer_group", "uniq_key"),
    ),
    Table(
        "consumer_filters",
        schemas.CONSUMER_FILTERS,
        "ingested",
        key=("cluster", "broker", "broker_id", "snapshot_ts", "topic", "consumer_group"),
    ),
    Table("audit_duplicates", audit_schemas.AUDIT_DUPLICATES, "audit"),
    Table("audit_losses", audit_schemas.AUDIT_LOSSES, "audit"),
    Table("audit_lag", audit_schemas.AUDIT_LAG, "audit"),
    Table("audit_dead_letters", audit_schemas.AUDIT_DEAD_LETTERS, "audit"),
    Table("resend_candidates", audit_schemas.RESEND_CANDIDATES, "audit"),
    Table("manual_handling", audit_schemas.MANUAL_HANDLING, "audit"),
    Table("consistency", audit_schemas.CONSISTENCY, "audit"),
    Table("audit_transactions", audit_schemas.AUDIT_TRANSACTIONS, "audit"),
    Table("audit_filters", audit_schemas.AUDIT_FILTERS, "audit"),
    Table("resend_log", audit_schemas.RESEND_LOG, "remediation"),
    Table("dlq_replay_log", audit_schemas.DLQ_REPLAY_LOG, "remediation"),
    Table("repair_log", audit_schemas.REPAIR_LOG, "remediation"),
)

TABLES: dict[str, Table] = {t.name: t for t in _CATALOG}
INGESTED_TABLES: dict[str, StructType] = {
    t.name: t.schema for t in _CATALOG if t.layer == "ingested"
}
AUDIT_TABLES: dict[str, StructType] = {t.name: t.schema for t in _CATALOG if t.layer == "audit"}
RESEND_LOG = TABLES["resend_log"]
DLQ_REPLAY_LOG = TABLES["dlq_replay_log"]  # written by replays, read by the audit
REPAIR_LOG = TABLES["repair_log"]  # written by repairs of lost_after_ack losses


def existing(lake: str | Path, names: Iterable[str]) -> tuple[str, ...]:
    """The named tables that the lake holds."""
    from pipeline.delta_io import table_exists

    return tuple(n for n in names if table_exists(table_path(lake, n)))


def system_rows(
    lake: str | Path, names: Iterable[str], system: str, columns: list[str]
) -> list[dict[str, Any]]:
    """The `columns` of one system's rows of the named audit tables (a row without `system`
    is RocketMQ's), read with pyarrow, without Spark; a table not written yet has none."""
    from pipeline.delta_files import read_arrow

    out = []
    for name in names:
        table = read_arrow(table_path(lake, name), AUDIT_TABLES[name])
        rows = table.select([*columns, "system"]).to_pylist()
        out += [{c: r[c] for c in columns} for r in rows if (r["system"] or ROCKETMQ) == system]
    return out


def clusters(lake: str | Path) -> list[str]:
    """The clusters whose data the lake holds (named by its ingest checkpoints and ledger
    rows), read with pyarrow, without Spark."""
    from pipeline.delta_files import read_arrow

    found: set[str] = set()
    for name in ("ingest_checkpoint", "message_stub"):
        rows = read_arrow(table_path(lake, name), schemas.struct_of("cluster:str"))
        found |= set(rows["cluster"].to_pylist())
    return sorted(c for c in found if c)


def one_cluster(lake: str | Path, cluster: str | None = None) -> str:
    """The cluster a remediation acts on: `cluster` if given, else the lake's only one."""
    if cluster:
        return validate_group(cluster)
    found = clusters(lake)
    if len(found) != 1:
        held = f"clusters {found}" if found else "no cluster's data yet"
        raise ValueError(f"lake {lake} holds {held}: name the cluster to act on (--cluster)")
    return found[0]


def read_tables(
    lake: str | Path, names: Iterable[str], spark: SparkSession
) -> dict[str, DataFrame]:
    """The named tables as DataFrames over their catalog schemas."""
    from pipeline.delta_io import DeltaIO

    io = DeltaIO(spark)
    return {n: io.read(table_path(lake, n), TABLES[n].schema) for n in names}
