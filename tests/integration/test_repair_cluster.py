"""Loss repair against a real broker over the small audit data (L1: acknowledged, never stored).

A real cluster is started on the data dir's broker-a store; L1's body is kept by the
producer, L3 (kept too) was being repaired by a run killed after its send, L2 has no kept
body. Through `mqaudit pipeline repair`: a dry run sends nothing, a real run sends L1 and
settles L3 without sending it twice, a second run skips both, --force sends L1 again, L2 is
logged not repairable, and the next ingest + audit no longer reports L1 or L3 as lost.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from broker_runtime.cli.main import main
from broker_runtime.client.admin import MQAdmin
from broker_runtime.client.model import MQClientError
from broker_runtime.common import aio
from broker_runtime.common.message import KEYS, UNIQ_KEY, Message
from broker_runtime.ledger.engine import run_tx
from broker_runtime.ledger.producer import Confirmation, ProducerLedger, StubRecord, body_hash
from broker_runtime.ledger.schema import message_stub
from pipeline.delta_io import DeltaIO
from pipeline.jobs.audit import run_audit
from pipeline.jobs.repair import REPAIR_ID_PROPERTY, plan_step, repair_message
from pipeline.lake import REPAIR_LOG, TABLES
from pipeline.remediation.replay_request import RepairRequest
from pipeline.remediation.resend_bodies import Body
from pipeline.remediation.resend_plan import Candidate
from pipeline.remediation.sender import BrokerClient, BrokerTarget
from tests.dags.traffic import copies_on_broker, ingest
from tests.integration.audit_data import build_data_dir
from tests.integration.cluster_fixtures import running_cluster
from tests.integration.test_audit_pipeline import TOPIC

pytestmark = [pytest.mark.integration, pytest.mark.slow]
# The data builder's store files: the broker must read them with the same geometry.
STORE = {
    "store.cq_entries_per_file": "1000",
    "store.index_hash_slots": "5000000",
    "store.index_max_entries": "20000000",
}
LOSSES = ("audit_losses",)  # the audit's losses only: the other tables cost time, add nothing
BODIES = {"L1": b"payment 1, acknowledged then lost", "L3": b"payment 3, lost too"}


def _ledger(data_dir: Path) -> None:
    """L1's body kept (its stub given the body's hash and a key), L3 kept and lost, L2 lost
    with no body."""
    ledger = ProducerLedger.open(data_dir)
    msgs = {k: Message(TOPIC, b, {UNIQ_KEY: k, KEYS: f"order-{k}"}) for k, b in BODIES.items()}
    ledger.record_before_send([StubRecord.of(msgs["L3"]), StubRecord("L2", TOPIC, "0" * 64)])
    ledger.confirm([Confirmation("L3", "broker-a", 1, 98), Confirmation("L2", "broker-a", 1, 97)])
    stmt = update(message_stub).where(message_stub.c.msg_id == "L1")
    values = {"body_hash": body_hash(BODIES["L1"]), "keys": "order-L1"}
    run_tx(ledger.engine, lambda c: c.execute(stmt.values(**values)))
    ledger.keep_bodies(list(msgs.values()))
    ledger.close()


def _create_topic(namesrv: str) -> None:
    """TopicA as the cluster where the loss happened had it (the broker reads topics from its
    config, not from the store files); returns once the name server routes it."""

    async def create() -> None:
        async with MQAdmin(namesrv) as admin:
            await admin.topic_create(TOPIC, queues=2)

    aio.run(create())
    deadline = time.monotonic() + 30
    while True:
        try:
            copies_on_broker(namesrv, TOPIC, "L1")
            return
        except MQClientError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _lost(spark: Any, lake: Path) -> set[str]:
    t = TABLES["audit_losses"]
    df = DeltaIO(spark).read(t.path(lake), t.schema).filter("kind = 'lost_after_ack'")
    return {r["msg_id"] for r in df.collect()}


def _log(spark: Any, lake: Path, repair_id: str) -> dict[str, dict[str, Any]]:
    """msg_id -> the latest row of `repair_id` in LAKE/repair_log."""
    df = DeltaIO(spark).read(REPAIR_LOG.path(lake), REPAIR_LOG.schema)
    rows = sorted((r.asDict() for r in df.collect()), key=lambda r: r["ts"])
    return {r["msg_id"]: r for r in rows if r["repair_id"] == repair_id}


def test_repair_of_lost_after_ack(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.conftest import local_spark

    spark = local_spark()
    data_dir, lake = build_data_dir(tmp_path), tmp_path / "lake"
    _ledger(data_dir)
    with running_cluster(
        data_dir, groups=("broker-a",), slaves=False, name_servers=1, settings=STORE
    ) as c:
        _create_topic(c.namesrv_addr)
        ingest(spark, data_dir, lake)
        run_audit(lake, spark, progress=False, tables=LOSSES)
        assert _lost(spark, lake) == {"L1", "L2", "L3"}

        def repair(*args: str) -> dict[str, Any]:
            argv = ["pipeline", "repair", "--lake", str(lake), "--data-dir", str(data_dir)]
            code = main([*argv, "--rate", "20", "--quiet", *args])
            out: dict[str, Any] = json.loads(capsys.readouterr().out)
            assert code == 0, out
            return out

        def copies(msg_id: str) -> list[Any]:
            return copies_on_broker(c.namesrv_addr, TOPIC, msg_id)

        dry = repair("--repair-id", "r-dry")
        assert dry["plan"]["planned"] == 2 and dry["by_status"] == {"planned": 2, "skipped": 1}
        assert _log(spark, lake, "r-dry")["L2"]["reason"].startswith("not repairable: no body")
        assert copies("L1") == [] and copies("L3") == []

        # A run killed right after sending L3: its plan is logged, the send is not.
        killed = RepairRequest(msg_ids=("L3",), dry_run=False)
        target = BrokerTarget(c.namesrv_addr)
        plan_step(str(lake), data_dir, killed, "r-killed", target=target, spark=spark)
        l3 = Candidate("L3", TOPIC, None, "order-L3", body_hash(BODIES["L3"]), 1)
        with BrokerClient(target, retry_times=0) as client:
            client.send(repair_message(l3, Body(BODIES["L3"], None, "test"), "r-killed"))

        real = repair("--no-dry-run", "--repair-id", "r-1")
        assert real["plan"]["settled"] == {"found_sent": 1, "not_stored": 0}
        assert real["send"]["sent"] == 1 and real["by_status"] == {"sent": 1, "skipped": 2}
        (l1,) = copies("L1")
        assert (l1.body, l1.properties[KEYS], l1.properties[REPAIR_ID_PROPERTY]) == (
            BODIES["L1"], "order-L1", "r-1",
        )  # fmt: skip
        logged = _log(spark, lake, "r-1")
        assert (logged["L1"]["status"], logged["L1"]["new_offset"]) == ("sent", l1.queue_offset)
        assert "already repaired (by r-killed" in logged["L3"]["reason"]
        assert len(copies("L3")) == 1
        stub = ProducerLedger.open(data_dir).get("L1")
        assert stub is not None and (stub["status"], stub["queue_offset"]) == (
            "CONFIRMED", l1.queue_offset,
        )  # fmt: skip

        again = repair("--no-dry-run", "--repair-id", "r-2")
        assert again["send"]["sent"] == 0 and again["by_status"] == {"skipped": 3}
        assert len(copies("L1")) == 1

        forced = repair("--no-dry-run", "--force", "--msg-id", "L1", "--repair-id", "r-3")
        assert forced["by_status"] == {"sent": 1} and len(copies("L1")) == 2

        ingest(spark, data_dir, lake)
        run_audit(lake, spark, progress=False, tables=LOSSES)
        assert _lost(spark, lake) == {"L2"}  # repaired: a copy is stored now; L2 had no body
