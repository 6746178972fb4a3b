"""One explicit StructType per ingested table (and per reader output); Arrow schemas are
derived. The catalog (`pipeline.lake`) gives each table its name, partitioning, key and path.

Every broker-derived row, and every ledger row, names its `cluster` (RocketMQ's
brokerClusterName: a broker's config, or `cluster_name` in a data dir's cluster.json) beside
its `broker`: one lake holds several clusters, and two clusters may both have a `broker-a`.
Ledger rows take the cluster of the data dir their ledger belongs to. `cluster` came later,
so it is the last column; a lake written before it is refused until migrated
(pipeline.jobs.migrate).

Timestamps are epoch milliseconds (int64, UTC) everywhere. Every field is nullable: Spark
reads files back as nullable, so nullability is not part of the contract checked here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

if TYPE_CHECKING:
    import pyarrow as pa

_TYPES: dict[str, DataType] = {
    "str": StringType(),
    "int": IntegerType(),
    "long": LongType(),
    "bool": BooleanType(),
    "bin": BinaryType(),
    "map": MapType(StringType(), StringType()),
    "date": DateType(),
}


def struct_of(spec: str) -> StructType:
    """`name:type, ...` -> StructType (all nullable); keeps the tables below readable."""
    fields = []
    for item in spec.split(","):
        name, kind = item.strip().split(":")
        fields.append(StructField(name, _TYPES[kind], True))
    return StructType(fields)


# What the commitlog reader emits: header fields as stored, hosts as `ip:port`, the offset
# msgId, properties parsed into a map (its batches also carry the properties the lineage is
# read from as columns: readers.unit_batch.PICKED). Binary decoding happens nowhere else.
RAW_MESSAGE = struct_of(
    "broker:str, broker_id:int, phys_offset:long, msg_id:str, total_size:int, body_crc:int,"
    " crc_ok:bool, queue_id:int, flag:int, queue_offset:long, sys_flag:int, born_ts:long,"
    " born_host:str, store_ts:long, store_host:str, reconsume_times:int,"
    " prepared_tx_offset:long, body_size:int, body:bin, topic:str, properties:map"
)

MESSAGES = struct_of(
    "broker:str, broker_id:int, phys_offset:long, total_size:int, msg_id:str, topic:str,"
    " queue_id:int, queue_offset:long, uniq_key:str, keys:str, tags:str, born_ts:long,"
    " store_ts:long, reconsume_times:int, body_crc:int, crc_ok:bool, flag:int, sys_flag:int,"
    " born_host:str, store_host:str, prepared_tx_offset:long, body_size:int, body:bin,"
    " properties:map, delivery_topic:str, original_topic:str, origin_msg_id:str,"
    " consumer_group:str, is_retry:bool, is_dlq:bool, is_scheduled:bool, delay_level:int,"
    " ingest_run:long, store_date:date, cluster:str"
)

CONSUME_QUEUE = struct_of(
    "broker:str, broker_id:int, topic:str, queue_id:int, queue_offset:long, phys_offset:long,"
    " size:int, tags_code:long, ingest_run:long, cluster:str"
)

# max_offset / min_offset: the queue's bounds at snapshot time (getMaxOffsetInQueue and
# getMinOffsetInQueue). min_offset came later: it is last so that older tables take it as
# an added column.
CONSUMER_OFFSETS = struct_of(
    "broker:str, broker_id:int, snapshot_ts:long, topic:str, consumer_group:str, queue_id:int,"
    " committed_offset:long, max_offset:long, ingest_run:long, min_offset:long, cluster:str"
)

# The SQL92 subscriptions a broker kept (STORE/config/consumerFilter.json), one row per
# (topic, group) per snapshot (the file's time); dead_ts null while the group is subscribed.
CONSUMER_FILTERS = struct_of(
    "broker:str, broker_id:int, snapshot_ts:long, topic:str, consumer_group:str,"
    " expression_type:str, expression:str, client_version:long, born_ts:long, dead_ts:long,"
    " ingest_run:long, cluster:str"
)

# The ledgers, as the broker's ledger schema (broker_runtime.ledger.schema) defines them.
# The columns after updated_at / finished_at came later (RabbitMQ): `system` says whose row
# it is (rocketmq for rows written before it existed, see LEDGER_DEFAULTS).
MESSAGE_STUB = struct_of(
    "msg_id:str, topic:str, tags:str, keys:str, body_hash:str, status:str, send_count:int,"
    " broker:str, queue_id:int, queue_offset:long, next_resend_at:long, created_at:long,"
    " updated_at:long, system:str, routing_key:str, headers:str, return_reason:str,"
    " cluster:str"
)

MESSAGE_LOG = struct_of(
    "id:long, msg_id:str, topic:str, group:str, client_id:str, broker:str, queue_id:int,"
    " queue_offset:long, reconsume_times:int, received_at:long, outcome:str, finished_at:long,"
    " system:str, routing_key:str, redelivered:bool, settle:str, requeue:bool, death:str,"
    " cluster:str"
)

# Ledger columns added later: what a ledger written before them holds in their place.
LEDGER_DEFAULTS: dict[str, str | None] = {
    "system": "rocketmq", "routing_key": None, "headers": None, "return_reason": None,
    "redelivered": None, "settle": None, "requeue": None, "death": None,
}  # fmt: skip

# RabbitMQ topologies read from the management API, one snapshot per virtual host and time:
# a row per exchange (`kind` exchange: name, type, alternate), queue (its dead-letter, TTL
# and length settings) and binding (source, destination, routing key, arguments as JSON).
RABBIT_TOPOLOGY = struct_of(
    "vhost:str, snapshot_ts:long, kind:str, name:str, type:str, alternate:str, source:str,"
    " destination:str, destination_type:str, routing_key:str, arguments:str,"
    " dead_letter_exchange:str, dead_letter_routing_key:str, message_ttl:long,"
    " max_length:long, max_length_bytes:long, overflow:str, delivery_limit:long"
)

# Bytes that could not be parsed. `final` is false for a damaged tail at the end of the
# written log: the next run looks at it again (it may have been a write in flight).
QUARANTINE = struct_of(
    "broker:str, broker_id:int, file:str, position:long, log_offset:long, length:long,"
    " reason:str, detail:str, final:bool, first_run:long, cluster:str"
)

# One row per broker and source per run step: `planned` rows are written before any data
# table, `done` rows after all of them (see pipeline.jobs.ingest_state).
INGEST_CHECKPOINT = struct_of(
    "run:long, status:str, broker:str, broker_id:int, store_dir:str, source:str,"
    " start_offset:long, plan_end:long, next_offset:long, rows:long, quarantined:long,"
    " created_at:long, cluster:str"
)


# One row per transaction (per broker, producer group and UNIQ_KEY), derived from the
# `messages` table's half, op, check-max and committed units (pipeline.transforms.
# transactions); rebuilt whole by an ingest that read new units. Times are store times;
# `state` is as of the ingest, the audit re-derives it as of its own time from the times.
TRANSACTIONS = struct_of(
    "broker:str, producer_group:str, uniq_key:str, keys:str, topic:str, queue_id:int,"
    " half_queue_offset:long, half_phys_offset:long, half_units:int, checks:int, born_ts:long,"
    " half_ts:long, last_half_ts:long, ops:int, op_ts:long, commits:int, commit_offsets:int,"
    " commit_ts:long, commit_queue_offset:long, gave_up_ts:long, state:str, ingest_run:long,"
    " cluster:str"
)


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark uses for `schema` (what readers emit and delta-rs stores)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema)


def same_fields(a: StructType, b: StructType) -> bool:
    """Whether two schemas have the same field names and types in order (nullability aside)."""
    return [(f.name, f.dataType) for f in a.fields] == [(f.name, f.dataType) for f in b.fields]
