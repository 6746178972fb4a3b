"""The `transactions` table and `audit_transactions` over a real store: the units written by the
broker's own transaction message builders (broker_runtime.broker.transactions) through the
real MessageStore, some of them as no healthy broker writes them (a second commit of one half,
a rollback whose message was sent outside the transaction, a rollback delivered with no copy
in the store), ingested by the real ingest and audited."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from broker_runtime.broker import transactions as tx
from broker_runtime.client.check_resume import resumed_half
from broker_runtime.client.model import new_message
from broker_runtime.client.msg_id import set_uniq_id
from broker_runtime.common import findings as K
from broker_runtime.common.message import (
    PRODUCER_GROUP,
    TRAN_MSG,
    TRANSACTION_PREPARED_TYPE,
    UNIQ_KEY,
    Message,
)
from broker_runtime.store.message_store import MessageStore
from expectations.gates import run_gate
from pipeline import schemas
from pipeline.delta_io import DeltaIO
from pipeline.jobs.ingest import run_ingest
from pipeline.lake import table_path
from pipeline.transforms.audit_common import MESSAGE_COLUMNS
from pipeline.transforms.filter_audit import not_selected
from pipeline.transforms.transaction_audit import audit_transactions
from tests.unit.pipeline.audit_helpers import delivery, frame, log, offsets, snapshot
from tests.unit.pipeline.stores import config

pytestmark = pytest.mark.slow
STUCK_MS = 66_000
GROUP = "pg"


class Writer:
    """Writes a store as a broker would, and as a damaged one would."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store
        self.ids: dict[str, str] = {}

    def put(self, msg: Message) -> Any:
        [r] = self.store.put_messages([msg])
        self.store.wait_dispatched(None)
        stored = self.store.message_at(r.phys_offset)
        assert stored is not None
        return stored

    def half(self, name: str, queue_id: int = 0) -> Any:
        msg = new_message("TopicA", name.encode())
        msg.queue_id = queue_id
        set_uniq_id(msg)
        self.ids[name] = msg.properties[UNIQ_KEY]
        msg.properties |= {TRAN_MSG: "true", PRODUCER_GROUP: GROUP}
        msg.sys_flag |= TRANSACTION_PREPARED_TYPE
        return self.put(tx.half_message(msg))

    def commit(self, half: Any) -> Any:
        committed = self.put(tx.committed_message(half))
        self.put(tx.op_message(half, 0))
        return committed

    def rollback(self, half: Any) -> None:
        self.put(tx.op_message(half, 0))

    def recheck(self, half: Any, times: int) -> Any:
        for n in range(1, times + 1):
            half = self.put(tx.rechecked_half(half, n))
        return half


def write(store_dir: Path) -> tuple[dict[str, str], dict[str, int]]:
    store = MessageStore(config(store_dir), disk_ratio=lambda _p: 0.0)
    w = Writer(store)
    try:
        ok = w.commit(w.half("ok"))
        w.rollback(w.half("rolled"))
        h = w.half("outside")
        w.rollback(h)
        plain = new_message("TopicA", b"outside")
        plain.properties[UNIQ_KEY] = w.ids["outside"]
        w.put(plain)
        w.rollback(w.half("lost-commit"))  # delivered, but no copy: a damaged store
        h = w.half("twice")
        w.commit(h)
        twice = w.commit(h)
        w.half("stuck")
        w.recheck(w.half("unresolved"), 2)
        w.put(tx.discarded_half(w.recheck(w.half("gave-up"), 3)))
        given_up = w.put(tx.discarded_half(w.recheck(w.half("resumed"), 3)))
        w.put(tx.half_message(resumed_half(given_up)))  # mqaudit admin resume-check
        late = w.commit(w.half("late", queue_id=1))
        h = w.half("check-commit")
        rechecked = w.recheck(h, 1)
        w.commit(h)  # the producer's END_TRANSACTION, late
        w.commit(rechecked)  # and the answer to the check-back
    finally:
        store.shutdown()
    at = {"ok": ok.queue_offset, "twice": twice.queue_offset, "late": late.queue_offset}
    return w.ids, at


def test_transactions_are_found_with_their_causes(spark: SparkSession, tmp_path: Path) -> None:
    data = tmp_path / "data"
    ids, at = write(data / "brokers" / "broker-a" / "master")
    lake = tmp_path / "lake"
    run_ingest(data, lake, spark, progress=False)
    io = DeltaIO(spark)
    table = io.read(table_path(lake, "transactions"), schemas.TRANSACTIONS)
    by_name = {v: k for k, v in ids.items()}
    rows = {r["uniq_key"]: r for r in table.collect()}
    state = {by_name[k]: r["state"] for k, r in rows.items()}
    assert state == {
        "ok": K.TX_COMMITTED,
        "rolled": K.TX_ROLLED_BACK,
        "outside": K.TX_ROLLED_BACK,
        "lost-commit": K.TX_ROLLED_BACK,
        "twice": K.TX_COMMITTED,
        "stuck": K.TX_PENDING,
        "unresolved": K.TX_PENDING,
        "gave-up": K.TX_GAVE_UP,
        "resumed": K.TX_PENDING,
        "late": K.TX_COMMITTED,
        "check-commit": K.TX_COMMITTED,
    }
    twice = rows[ids["twice"]]
    assert (twice["commits"], twice["commit_offsets"], twice["ops"]) == (2, 1, 2)
    assert rows[ids["gave-up"]]["checks"] == 3 and rows[ids["unresolved"]]["half_units"] == 3
    assert rows[ids["late"]]["queue_id"] == 1 and rows[ids["ok"]]["topic"] == "TopicA"
    assert {r["producer_group"] for r in rows.values()} == {GROUP}

    messages = io.read(table_path(lake, "messages"), schemas.MESSAGES).select(*MESSAGE_COLUMNS)
    last = max(r["last_half_ts"] for r in rows.values())
    consumed = ["ok", "twice", "check-commit", "outside", "lost-commit"]
    deliveries = log(
        spark,
        [delivery(i, ids[n], received_at=last + 1) for i, n in enumerate(consumed)]
        + [delivery(99, ids["twice"], received_at=last + 2)],
    )
    # g1's offset on queue 1 stops before "late"; it took queue 0 to the end.
    snaps = offsets(spark, [snapshot(0, at["late"], at["late"] + 1, queue_id=1,
                                     snapshot_ts=last + 3)])  # fmt: skip

    stored = io.read(table_path(lake, "messages"), schemas.MESSAGES)  # with the properties
    unselected = not_selected(frame(spark, schemas.CONSUMER_FILTERS, []), stored, last)

    def audit(as_of: int) -> Any:
        return audit_transactions(table, messages, deliveries, snaps, unselected, as_of, STUCK_MS)

    def found(as_of: int) -> set[tuple[Any, ...]]:
        return {
            (by_name[r["msg_id"]], r["group"], r["kind"], r["cause"], r["count"])
            for r in audit(as_of).collect()
        }

    young = {
        ("twice", None, K.COMMITTED_TWICE, K.END_TRANSACTION_REPEATED, 2),
        ("check-commit", None, K.COMMITTED_TWICE, K.COMMIT_OF_RECHECKED_HALF, 2),
        ("gave-up", None, K.CHECK_GAVE_UP, K.TRANSACTION_CHECK_MAX, 3),
        ("outside", "g1", K.ROLLED_BACK_BUT_DELIVERED, K.SENT_OUTSIDE_TRANSACTION, 1),
        ("lost-commit", "g1", K.ROLLED_BACK_BUT_DELIVERED, K.NO_COMMITTED_COPY, 1),
        ("late", "g1", K.COMMITTED_NEVER_CONSUMED, K.OFFSET_NOT_REACHED, 1),
    }
    assert found(last + 10) == young
    old = {
        ("stuck", None, K.HALF_STUCK, K.NEVER_CHECKED, 1),
        ("unresolved", None, K.HALF_STUCK, K.CHECK_UNRESOLVED, 3),
        ("resumed", None, K.HALF_STUCK, K.CHECK_UNRESOLVED, 5),
    }
    assert found(last + STUCK_MS + 10) == young | old
    # As of before anything was committed or ended, every transaction begun is pending.
    first = min(r["half_ts"] for r in rows.values())
    assert found(first) == set()
    # A SQL92 group is expected to get only what its expression selects: g1 subscribed with
    # one no committed message matches is owed none of them.
    sql = {
        "broker": "broker-a", "broker_id": 0, "snapshot_ts": last, "topic": "TopicA",
        "consumer_group": "g1", "expression_type": "SQL92", "expression": "amount > 100",
        "client_version": 1, "born_ts": first - 1, "dead_ts": None, "ingest_run": 1,
    }  # fmt: skip
    owed = not_selected(frame(spark, schemas.CONSUMER_FILTERS, [sql]), stored, last + 10)
    rows_sql = audit_transactions(table, messages, deliveries, snaps, owed, last + 10, STUCK_MS)
    kinds = {(by_name[r["msg_id"]], r["kind"]) for r in rows_sql.collect()}
    assert ("late", K.COMMITTED_NEVER_CONSUMED) not in kinds
    assert {(n, k) for n, _, k, _, _ in young} - kinds == {("late", K.COMMITTED_NEVER_CONSUMED)}

    # The gates: the derived table is well formed; the findings break the healthy bounds.
    assert run_gate(table, "transactions").success
    bad = table.limit(1).withColumn("state", F.lit("half_done"))
    failed = run_gate(bad, "transactions", raise_on_failure=False)
    assert [f.columns for f in failed.failures] == [["state"]]
    gate = run_gate(audit(last + STUCK_MS + 10), "audit_transactions", raise_on_failure=False)
    bounds = {f.parameters.get("max_value") for f in gate.failures}
    assert bounds == {f"max_{k}" for k in K.KINDS["audit_transactions"]}
