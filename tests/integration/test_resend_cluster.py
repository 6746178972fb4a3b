"""Resend against a real cluster: the audit finds the stubs, the job resends the due ones
through the producer, confirms them at their new offsets, hands exhausted ones to a person,
and a second run sends nothing again."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from broker_runtime.client.model import new_message
from broker_runtime.client.producer import Producer
from broker_runtime.client.sync import SyncProducer
from broker_runtime.common.message import UNIQ_KEY, Message
from broker_runtime.ledger.producer import ProducerLedger, ResendBackoff, StubRecord
from pipeline.jobs.audit import AuditThresholds, run_audit
from pipeline.jobs.resend import run_resend
from pipeline.remediation.sender import BrokerTarget
from tests.dags.traffic import copies_on_broker, ingest
from tests.integration.cluster_fixtures import running_cluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TOPIC = "payments"
MAX = 3


def _stubs(data_dir: Path, namesrv: str) -> dict[str, str]:
    """The producer's ledger as the scenarios leave it; names -> msg ids."""
    ledger = ProducerLedger.open(data_dir, backoff=ResendBackoff(first_ms=1))
    never = Message(TOPIC, b"never reached the broker", {UNIQ_KEY: "NEVER-SENT-0001"})
    lost_answer = new_message(TOPIC, b"stored, answer lost", tags="t", keys="k-lost")
    nobody = Message(TOPIC, b"body kept nowhere", {UNIQ_KEY: "NO-BODY-0001"})
    tired = Message(TOPIC, b"sent too often", {UNIQ_KEY: "TIRED-0001"})
    with SyncProducer(Producer(namesrv, "resend-test")) as p:
        p.send(new_message(TOPIC, b"creates the topic"))
        p.send(lost_answer)  # stored; its stub stays UNCONFIRMED, as after a lost answer
    ledger.record_before_send([StubRecord.of(m) for m in (never, lost_answer, nobody, tired)])
    ledger.keep_bodies([never, tired])
    ledger.mark_resent(["TIRED-0001"])
    ledger.mark_resent(["TIRED-0001"])  # send count 3: the max
    ledger.close()
    return {
        "never": "NEVER-SENT-0001",
        "lost": lost_answer.properties[UNIQ_KEY],
        "nobody": "NO-BODY-0001",
        "tired": "TIRED-0001",
    }


def test_resend_end_to_end(tmp_path: Path) -> None:
    from tests.conftest import local_spark

    spark = local_spark()
    data_dir, lake = tmp_path / "c", tmp_path / "lake"
    with running_cluster(data_dir, groups=("broker-a",), slaves=False, name_servers=1) as c:
        ids = _stubs(data_dir, c.namesrv_addr)
        time.sleep(0.01)  # the stubs' next resend time (1 ms back-off) has passed
        ingest(spark, data_dir, lake)
        as_of = time.time_ns() // 1_000_000
        limits = AuditThresholds(max_send_count=MAX)
        audit = run_audit(lake, spark, as_of, limits, progress=False)
        assert audit["tables"]["resend_candidates"]["rows"] == 3  # never, lost, nobody
        assert audit["tables"]["manual_handling"]["rows"] == 1  # tired

        def resend(run_id: str) -> dict[str, Any]:
            return run_resend(
                str(lake), data_dir, BrokerTarget(c.namesrv_addr), as_of_ms=as_of,
                run_id=run_id, max_send_count=MAX, report_dir=tmp_path / run_id,
                spark=spark, progress=False,
            )  # fmt: skip

        first = resend("r1")
        assert first["counts"] == {"sent": 2, "failed": 0, "skipped": 0, "manual": 2}
        ledger = ProducerLedger.open(data_dir)
        for name in ("never", "lost"):
            row = ledger.get(ids[name])
            assert row is not None and (row["status"], row["send_count"]) == ("CONFIRMED", 2)
            copies = copies_on_broker(c.namesrv_addr, TOPIC, ids[name])
            assert row["queue_offset"] in {m.queue_offset for m in copies}
        assert len(copies_on_broker(c.namesrv_addr, TOPIC, ids["never"])) == 1
        assert len(copies_on_broker(c.namesrv_addr, TOPIC, ids["lost"])) == 2  # resent: twice
        for name in ("nobody", "tired"):
            row = ledger.get(ids[name])
            assert row is not None and row["status"] == "VOID"
        manual = {m["msg_id"]: m["reason"] for m in first["manual"]}
        assert "no copy of the body" in manual[ids["nobody"]]
        assert manual[ids["tired"]] == f"send count 3 at max ({MAX})"
        listed = (tmp_path / "r1" / "manual_handling.csv").read_text()
        assert ids["nobody"] in listed and ids["tired"] in listed

        # The same audit again: every stub moved on since, so nothing is sent twice.
        second = resend("r2")
        assert second["counts"] == {"sent": 0, "failed": 0, "skipped": 4, "manual": 0}
        assert len(copies_on_broker(c.namesrv_addr, TOPIC, ids["never"])) == 1
        ledger.close()
