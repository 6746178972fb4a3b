"""The RabbitMQ half of the DLQ replay (pipeline.jobs.replay): which dead letters, and the
publishes that send them back to the exchange and routing keys they died with.

A RabbitMQ dead letter is in the lake as the `message_log` rows of a consumer of a
dead-letter queue (`system` rabbitmq, with the `x-death` history in `death`); the replay
takes, per message, the earliest such row whose newest death is in the request's queue
(`group`), and sends it to that death's `exchange` with its first `routing-keys` (the others
as `CC`), as the broker had routed it. The lake holds no RabbitMQ bodies: the body is the
producer's kept body (`LedgeredPublisher(..., keep_bodies=True)`), used only when its sha256
is the stub's; the headers are the stub's (as first published), plus the replay's id.

The dead-letter queue is left as it is, as the RocketMQ replay leaves its %DLQ% copy: the
replay promises a copy in the original queue and a log of it, not a cleared dead-letter
queue; taking a message off a queue needs a consumer (the queue's own may hold or have acked
it already), and a copy taken off before the publish was confirmed could be lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipeline import schemas
from pipeline.delta_io import DeltaIO, table_exists
from pipeline.lake import table_path
from pipeline.remediation.rabbit_sender import RabbitMessage, RabbitTarget, dead_letter_message
from pipeline.remediation.replay_request import ReplayRequest
from pipeline.remediation.resend_plan import body_hash_ok
from pipeline.transforms.rabbit import newest_death, of_rabbitmq


def dead_letters_df(
    io: DeltaIO, lake: str, request: ReplayRequest, ids: Sequence[str] | None = None
) -> DataFrame:
    """msg_id, topic (the exchange to send to), dlq_msg_id, store_ts (when the dead letter
    was logged) and death, per message that died in the request's queue, earliest first."""
    log = of_rabbitmq(io.read(table_path(lake, "message_log"), schemas.MESSAGE_LOG))
    rows = newest_death(log).filter(
        (F.col("dead_queue") == request.group) & (F.col("cluster") == request.cluster)
    )
    if ids is None:
        if request.topic is not None:
            rows = rows.filter(F.col("dead_exchange") == request.topic)
        if request.from_ms is not None:
            rows = rows.filter(F.col("received_at") >= request.from_ms)
        if request.to_ms is not None:
            rows = rows.filter(F.col("received_at") <= request.to_ms)
    wanted = list(ids) if ids is not None else list(request.msg_ids)
    if wanted:
        rows = rows.filter(F.col("msg_id").isin(wanted))
    first = rows.groupBy("msg_id").agg(
        F.min_by(
            F.struct("received_at", "id", "group", "dead_exchange", "death"),
            F.struct("received_at", "id"),
        ).alias("d")
    )
    return first.select(
        "msg_id",
        F.col("d.dead_exchange").alias("topic"),
        F.format_string("%s#%d", F.col("d.group"), F.col("d.id")).alias("dlq_msg_id"),
        F.col("d.received_at").alias("store_ts"),
        F.col("d.death").alias("death"),
    )


def _stubs(io: DeltaIO, lake: str, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    path = table_path(lake, "message_stub")
    if not ids or not table_exists(path):
        return {}
    stubs = of_rabbitmq(io.read(path, schemas.MESSAGE_STUB)).filter(F.col("msg_id").isin(*ids))
    return {
        r["msg_id"]: r.asDict() for r in stubs.select("msg_id", "headers", "body_hash").collect()
    }


def replay_messages(
    io: DeltaIO, lake: str, request: ReplayRequest, replay_id: str, ids: Sequence[str],
    target: RabbitTarget,
) -> dict[str, RabbitMessage]:  # fmt: skip
    """The publishes of the dead letters `ids` that have a verified kept body, by msg_id."""
    letters = {r["msg_id"]: r for r in dead_letters_df(io, lake, request, ids).collect()}
    stubs = _stubs(io, lake, list(letters))
    ledger = target.producer_ledger()
    if ledger is None:
        return {}
    try:
        bodies = ledger.bodies(list(letters))
    finally:
        ledger.close()
    out: dict[str, RabbitMessage] = {}
    for msg_id, r in letters.items():
        stub, body = stubs.get(msg_id), bodies.get(msg_id)
        if stub is None or body is None or not body_hash_ok(body, stub["body_hash"]):
            continue
        out[msg_id] = dead_letter_message(
            msg_id, body, r["death"], stub["headers"], replay_id, r["dlq_msg_id"]
        )
    return out
