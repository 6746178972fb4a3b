"""Where a resend gets the message body from: the stub holds only its sha256.

First the producer's kept bodies (`message_body` in the producer ledger), then any copy a
broker stored under the same UNIQ_KEY (the lake's `messages`, retry and dead-letter copies
included). A body is used only if its hash is the stub's; a message with neither goes to
manual handling, never out with a wrong or empty body.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import functions as F

from broker_runtime.ledger.producer import ProducerLedger
from pipeline import schemas
from pipeline.delta_io import DeltaIO, table_exists
from pipeline.lake import table_path
from pipeline.remediation.resend_plan import Candidate, body_hash_ok


@dataclass(frozen=True)
class Body:
    data: bytes
    properties: dict[str, str] | None  # a stored copy's properties; None for a kept body
    source: str  # "producer ledger" or "stored copy on <broker>"


def find_bodies(
    candidates: Sequence[Candidate], ledger: ProducerLedger, io: DeltaIO, lake: str
) -> dict[str, Body]:
    """The verified body of each candidate that has one, by msg_id."""
    want = {c.msg_id: c for c in candidates}
    found: dict[str, Body] = {}
    for msg_id, data in ledger.bodies(list(want)).items():
        if body_hash_ok(data, want[msg_id].body_hash):
            found[msg_id] = Body(data, None, "producer ledger")
    rest = [m for m in want if m not in found]
    path = table_path(lake, "messages")
    if not rest or not table_exists(path):
        return found
    copies = (
        io.read(path, schemas.MESSAGES)
        .filter(F.col("uniq_key").isin(rest) & ~F.col("is_scheduled"))
        .select("uniq_key", "broker", "body", "properties", "is_retry", "is_dlq", "store_ts")
        .orderBy("is_dlq", "is_retry", "store_ts")  # the first-sent copy when there is one
        .collect()
    )
    for r in copies:
        c = want[r["uniq_key"]]
        if c.msg_id not in found and body_hash_ok(bytes(r["body"]), c.body_hash):
            props = dict(r["properties"] or {})
            found[c.msg_id] = Body(bytes(r["body"]), props, f"stored copy on {r['broker']}")
    return found
