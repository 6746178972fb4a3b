"""Each DAG run end to end with `dag.test()` on a real cluster and lake (tiny traffic):
mq_audit (idempotent per interval), mq_retry_resend, mq_dlq_report, mq_dlq_replay (dry run,
real, repeated), and a bad replay request failing its first task."""

from __future__ import annotations

import csv
import datetime as dt
import json
import os
import shutil
import sqlite3
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from broker_runtime.common.message import UNIQ_KEY, Message
from broker_runtime.ledger.producer import ProducerLedger, ResendBackoff, StubRecord
from pipeline.spark_session import SMALL_DATA_SPARK
from tests.dags.conftest import AIRFLOW_WARNINGS, DAGS
from tests.dags.traffic import copies_on_broker, make_dead_letters, replays_on_broker, send_messages
from tests.integration.cluster_fixtures import Cluster, running_cluster

pytestmark = [pytest.mark.airflow, pytest.mark.integration, pytest.mark.slow, *AIRFLOW_WARNINGS]
GROUP, TOPIC = "pay-consumer", "orders"
REPLAY_DEFAULTS = {
    "topic": None,
    "from_time": None,
    "to_time": None,
    "msg_ids": [],
    "max_messages": 100,
    "messages_per_second": 50,
    "dry_run": True,
    "force": False,
}


@dataclass
class Site:
    cluster: Cluster
    root: Path
    dead: list[str]
    never_sent: str

    @property
    def lake(self) -> Path:
        return self.root / "lake"

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    def summary(self, dag_id: str) -> dict[str, Any]:
        pointer = json.loads((self.reports / dag_id / "latest.json").read_text())
        result: dict[str, Any] = json.loads(Path(pointer["summary"]).read_text())
        return result


LIVE_TEMP = shutil.ignore_patterns("*.tmp")


def run(dagbag: Any, dag_id: str, **kwargs: Any) -> Any:
    """`dag.test()`; the run's state and its tasks' states."""
    dr = dagbag.dags[dag_id].test(**kwargs)
    return dr.state, {ti.task_id: ti.state for ti in dr.get_task_instances()}


def replay_conf(**kw: Any) -> dict[str, Any]:
    # Every Param given: dag.test() keeps the Params of an earlier run in the same process.
    return {**REPLAY_DEFAULTS, "group": GROUP, **kw}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, airflow_db: Path) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("dagruns")
    data = root / "cluster"
    with (
        pytest.MonkeyPatch.context() as mp,
        running_cluster(data, groups=("broker-a",), slaves=False, name_servers=1) as c,
    ):
        for name, value in {
            "data_dir": data,
            "lake": root / "lake",
            "reports": root / "reports",
            "spark_master": "local[2]",
            "spark_conf": json.dumps(SMALL_DATA_SPARK),  # as the demo's
        }.items():
            mp.setenv(f"AIRFLOW_VAR_MQAUDIT_{name.upper()}", str(value))
        send_messages(c.namesrv_addr, TOPIC, 5)
        dead = make_dead_letters(c.namesrv_addr, GROUP, TOPIC, 3)
        ledger = ProducerLedger.open(data, backoff=ResendBackoff(first_ms=1))
        never = Message(TOPIC, b"lost before the broker", {UNIQ_KEY: "NEVER-REACHED-0001"})
        ledger.record_before_send([StubRecord.of(never)])
        ledger.keep_bodies([never])
        ledger.close()
        time.sleep(0.01)  # its 1 ms back-off is over
        yield Site(c, root, dead, "NEVER-REACHED-0001")


def test_mq_audit_runs_and_a_rerun_of_the_interval_changes_nothing(site: Site, dagbag: Any) -> None:
    # The interval ends after the stub's creation (a logical date has whole seconds).
    when = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(seconds=1)
    state, tasks = run(dagbag, "mq_audit", logical_date=when)
    assert state == "success", tasks
    first = site.summary("mq_audit")
    assert first["ingest"]["messages"] > 0
    assert Path(first["report"]["html"]).is_file()
    assert first["audit"]["tables"]["audit_dead_letters"]["rows"] == 3
    assert first["audit"]["tables"]["resend_candidates"]["rows"] == 1
    assert (site.reports / "data-docs" / "index.html").is_file()

    # The broker re-writes its offsets every few seconds: a snapshot newer than the interval
    # is ingested but must not change the interval's audit.
    later = time.time() + 5
    for f in (site.root / "cluster").rglob("consumerOffset.json"):
        os.utime(f, (later, later))
    state, _ = run(dagbag, "mq_audit", logical_date=when, run_conf={})
    assert state == "success"
    again = site.summary("mq_audit")
    assert again["ingest"]["run"] is None  # nothing new to ingest
    assert [n for n, t in again["audit"]["tables"].items() if t["written"]] == []


def test_mq_retry_resend_resends_the_due_stub(site: Site, dagbag: Any) -> None:
    state, tasks = run(dagbag, "mq_retry_resend")
    assert state == "success", tasks
    done = site.summary("mq_retry_resend")
    assert done["counts"]["sent"] == 1
    ledger = ProducerLedger.open(site.root / "cluster")
    row = ledger.get(site.never_sent)
    ledger.close()
    assert row is not None and (row["status"], row["send_count"]) == ("CONFIRMED", 2)
    (copy,) = copies_on_broker(site.cluster.namesrv_addr, TOPIC, site.never_sent)
    assert copy.body == b"lost before the broker" and copy.queue_offset == row["queue_offset"]


def test_mq_dlq_report_lists_every_dead_letter(site: Site, dagbag: Any) -> None:
    state, tasks = run(dagbag, "mq_dlq_report")
    assert state == "success", tasks
    built = site.summary("mq_dlq_report")["report"]
    with open(built["csv"], newline="") as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["msg_id"] for r in rows) == sorted(site.dead)
    assert {r["group"] for r in rows} == {GROUP}
    assert Path(built["html"]).is_file()


def test_mq_dlq_report_through_spark_submit(
    site: Site, variables: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SparkSubmitOperator mode: `spark-submit dags/spark_app.py dlq-report ...`."""
    from airflow.dag_processing.dagbag import DagBag

    variables(mqaudit_spark_submit="true", mqaudit_reports=site.root / "submitted")
    monkeypatch.setenv("AIRFLOW_CONN_MQAUDIT_SPARK", '{"conn_type": "spark", "host": "local[2]"}')
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    bag = DagBag(dag_folder=str(DAGS))
    state, tasks = run(bag, "mq_dlq_report")
    assert state == "success", tasks
    (csv_file,) = (site.root / "submitted" / "mq_dlq_report").glob("*/dead_letters.csv")
    with open(csv_file, newline="") as f:
        assert sorted(r["msg_id"] for r in csv.DictReader(f)) == sorted(site.dead)


def test_mq_dlq_replay_dry_run_then_real_then_nothing_twice(site: Site, dagbag: Any) -> None:
    namesrv = site.cluster.namesrv_addr
    state, tasks = run(dagbag, "mq_dlq_replay", run_conf=replay_conf(from_time=0))
    assert state == "success", tasks
    assert site.summary("mq_dlq_replay")["by_status"] == {"planned": 3}
    assert all(replays_on_broker(namesrv, TOPIC, m) == [] for m in site.dead)

    state, tasks = run(dagbag, "mq_dlq_replay", run_conf=replay_conf(from_time=0, dry_run=False))
    assert state == "success", tasks
    assert site.summary("mq_dlq_replay")["by_status"] == {"sent": 3}
    assert all(len(replays_on_broker(namesrv, TOPIC, m)) == 1 for m in site.dead)

    state, _ = run(dagbag, "mq_dlq_replay", run_conf=replay_conf(from_time=0, dry_run=False))
    assert state == "success"
    assert site.summary("mq_dlq_replay")["by_status"] == {"skipped": 3}
    assert all(len(replays_on_broker(namesrv, TOPIC, m)) == 1 for m in site.dead)


def test_a_bad_replay_request_fails_before_anything_is_read_or_sent(
    site: Site, dagbag: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    state, tasks = run(dagbag, "mq_dlq_replay", run_conf=replay_conf(dry_run=False))
    assert state == "failed"
    assert tasks["check_params"] == "failed"
    assert {tasks[t] for t in ("plan", "send", "summarize")} == {"upstream_failed"}
    out, err = capfd.readouterr()
    assert "give a time range (from_time and/or to_time) or msg_ids" in out + err


def test_a_failed_gate_fails_mq_audit_with_a_readable_message(
    site: Site, dagbag: Any, variables: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    broken = site.root / "broken"
    # no cluster.json; the brokers are live, so an atomic write's .tmp may vanish mid-copy
    shutil.copytree(site.root / "cluster" / "brokers", broken / "brokers", ignore=LIVE_TEMP)
    log = broken / "brokers" / "broker-a" / "master" / "commitlog" / f"{0:020d}"
    data = bytearray(log.read_bytes())
    at = data.find(b"lost before the broker")
    assert at > 0
    data[at] ^= 0xFF  # a flipped body byte: the message's CRC no longer matches
    log.write_bytes(bytes(data))
    variables(
        mqaudit_data_dir=broken, mqaudit_lake=broken / "lake", mqaudit_reports=broken / "reports"
    )
    state, tasks = run(dagbag, "mq_audit")
    assert state == "failed"
    assert (tasks["ingest"], tasks["validate"]) == ("success", "failed")
    assert (tasks["audit"], tasks["report"]) == ("upstream_failed", "upstream_failed")
    out, err = capfd.readouterr()
    text = out + err
    assert "data quality gate failed" in text and "quarantine" in text
    assert "bad_crc" in text


def test_mq_audit_gates_the_stubs_with_the_max_send_count_setting(
    site: Site, dagbag: Any, variables: Any
) -> None:
    """With mqaudit_max_send_count above 16 the resend DAG may send a stub a 17th time; the
    next mq_audit's gate on the ledger must allow what the setting allows (the validate step
    takes the same bound as the audit and the resend job)."""
    copy = site.root / "drift"
    # no cluster.json; the brokers are live, so an atomic write's .tmp may vanish mid-copy
    shutil.copytree(site.root / "cluster" / "brokers", copy / "brokers", ignore=LIVE_TEMP)
    shutil.copytree(site.root / "cluster" / "ledger", copy / "ledger")
    with sqlite3.connect(copy / "ledger" / "producer.db") as db:
        db.execute("UPDATE message_stub SET send_count = 17 WHERE msg_id = ?", (site.never_sent,))
    db.close()
    variables(
        mqaudit_data_dir=copy,
        mqaudit_lake=copy / "lake",
        mqaudit_reports=copy / "reports",
        mqaudit_max_send_count=20,
    )
    state, tasks = run(dagbag, "mq_audit")
    assert state == "success", tasks
