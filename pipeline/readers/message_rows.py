"""Decoded units (RAW_MESSAGE) -> `messages` rows: the properties the audit reads by name and
the retry / DLQ / schedule lineage, by the broker's names and routing rules, vectorised with
Arrow kernels in the worker that decoded them (so the rows never pass through the JVM).
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from broker_runtime.common.topics import DLQ_PREFIX, RETRY_PREFIX, SCHEDULE_TOPIC
from pipeline.schemas import MESSAGES, arrow_schema

MESSAGES_ARROW = arrow_schema(MESSAGES)
_MAX_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z: beyond it no date exists
_DAY_MS = 86_400_000
_INT = re.compile(r"[+-]?[0-9]+")
_SPACE = "".join(map(chr, range(0x21)))  # what Spark trims before a cast to int


def spark_int(text: str | None) -> int | None:
    """`text` as Spark's try_cast(... as int) reads it: trimmed, an optional sign, ASCII digits,
    within int32; None otherwise."""
    if text is None or not _INT.fullmatch(text := text.strip(_SPACE)):
        return None
    value = int(text)
    return value if -(2**31) <= value < 2**31 else None


def _ints(texts: pa.Array) -> pa.Array:
    """`spark_int` of each value, computed once per distinct value (a batch has few)."""
    distinct = pc.unique(texts)
    values = pa.array([spark_int(t) for t in distinct.to_pylist()], pa.int32())
    return values.take(pc.index_in(texts, value_set=distinct))


def _group_of(topic: pa.Array) -> pa.Array:
    group = pa.nulls(len(topic), pa.string())
    for prefix in (DLQ_PREFIX, RETRY_PREFIX):
        rest = pc.utf8_slice_codeunits(topic, len(prefix))
        group = pc.if_else(pc.starts_with(topic, prefix), rest, group)
    return group


def store_dates(store_ts: pa.Array) -> pa.Array:
    """The UTC day of the store time; null for a time no calendar has (a damaged header)."""
    ts = store_ts.to_numpy(zero_copy_only=False)
    ok = (ts >= 0) & (ts <= _MAX_MS)
    days = np.where(ok, ts // _DAY_MS, 0).astype(np.int32)
    return pa.array(days, pa.int32(), mask=~ok).cast(pa.date32())


def to_messages(raw: pa.RecordBatch, run: int, cluster: str) -> pa.RecordBatch:
    """One reader batch (RAW_MESSAGE and the PICKED property columns) of a broker of `cluster`
    -> the MESSAGES batch of the same rows."""
    topic = raw.column("topic")
    real_topic, uniq = raw.column("prop_real_topic"), raw.column("prop_uniq_key")
    scheduled = pc.equal(topic, SCHEDULE_TOPIC)
    delivery = pc.if_else(scheduled, pc.coalesce(real_topic, topic), topic)
    derived = {
        "uniq_key": uniq,
        "keys": raw.column("prop_keys"),
        "tags": raw.column("prop_tags"),
        "delivery_topic": delivery,
        "original_topic": pc.coalesce(raw.column("prop_retry_topic"), real_topic, topic),
        # The copy it derives from: the broker's send-back names it, and so does mqaudit's
        # DLQ replay (the dead-letter copy it sent back); else the message is its own origin.
        "origin_msg_id": pc.coalesce(
            raw.column("prop_origin_message_id"), raw.column("prop_replay_of"), uniq
        ),
        "consumer_group": _group_of(delivery),
        "is_retry": pc.starts_with(delivery, RETRY_PREFIX),
        "is_dlq": pc.starts_with(delivery, DLQ_PREFIX),
        "is_scheduled": scheduled,
        "delay_level": _ints(raw.column("prop_delay")),
        "ingest_run": pa.array(np.full(raw.num_rows, run, dtype=np.int64)),
        "store_date": store_dates(raw.column("store_ts")),
        "cluster": pa.repeat(pa.scalar(cluster, pa.string()), raw.num_rows),
    }
    columns = [derived[f.name] if f.name in derived else raw.column(f.name) for f in MESSAGES_ARROW]
    return pa.RecordBatch.from_arrays(columns, schema=MESSAGES_ARROW)
