"""The workload with one PostgreSQL database for every ledger (`--ledger-url`): producer
stubs and the consumer log land there, none under the data dir, and match truth.json; then
`mqaudit pipeline ingest --ledger-url` takes them from PostgreSQL into the lake."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from broker_runtime.ledger.engine import normalize_url
from broker_runtime.workload.truth import validate
from pipeline import schemas
from pipeline.delta_files import read_arrow
from tests.conftest import mqaudit_cmd
from tests.integration.cluster_fixtures import running_cluster

pytestmark = pytest.mark.integration


def test_ledgers_in_postgresql_match_the_truth_and_are_ingested(
    tmp_path: Path, postgres_url: str, cli_env: dict[str, str]
) -> None:
    with running_cluster(tmp_path / "c", name_servers=1, slaves=False) as c:
        truth = tmp_path / "truth.json"
        argv = ["workload", "--data-dir", str(c.data_dir), "--messages", "60", "--seed", "5"]
        argv += ["--scenario", "producer_resend,namesrv_split", "--truth", str(truth)]
        argv += ["--ledger-url", postgres_url]
        out = subprocess.run(mqaudit_cmd(*argv), capture_output=True, text=True, timeout=240)
    # namesrv_split needs two broker groups: it fails with a reason, the other scenario runs.
    assert out.returncode == 1, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert [f["scenario"] for f in summary["failed"]] == ["namesrv_split"]
    assert "needs two broker groups" in summary["failed"][0]["error"]
    doc = json.loads(truth.read_text())
    validate(doc)
    entry = doc["scenarios"]["producer_resend"]
    assert not (c.data_dir / "ledger").exists()
    cut_off = set(entry["injected"]["unreachable_msg_ids"])  # never reached the broker
    assert cut_off

    engine = create_engine(normalize_url(postgres_url))
    with engine.connect() as db:
        stubs = db.execute(text("SELECT status, count(*) FROM message_stub GROUP BY status"))
        assert dict(stubs.all()) == {"CONFIRMED": 30 - len(cut_off), "UNCONFIRMED": len(cut_off)}
        rows = db.execute(
            text('SELECT msg_id, count(*) FROM message_log WHERE "group" = :g GROUP BY msg_id'),
            {"g": entry["groups"][0]},
        ).all()
        log_ids = sorted(r[0] for r in db.execute(text("SELECT id FROM message_log")).all())
    engine.dispose()
    twice = {m: n for m, n in rows if n > 1}
    found = {f["msg_id"]: f["count"] for f in entry["findings"] if f["kind"] == "delivered_twice"}
    assert twice and found == twice
    assert len(rows) == 30 - len(cut_off) and not cut_off & {m for m, _ in rows}

    lake = tmp_path / "lake"
    argv = ["pipeline", "ingest", "--data-dir", str(c.data_dir), "--lake", str(lake)]
    argv += ["--ledger-url", postgres_url]
    run = subprocess.run(mqaudit_cmd(*argv), env=cli_env, capture_output=True, text=True,
                         timeout=280)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    stubs_in_lake = read_arrow(str(lake / "message_stub"), schemas.MESSAGE_STUB)
    statuses = dict(zip(stubs_in_lake.column("msg_id").to_pylist(),
                        stubs_in_lake.column("status").to_pylist(), strict=True))  # fmt: skip
    assert statuses == {m: "CONFIRMED" for m, _ in rows} | dict.fromkeys(cut_off, "UNCONFIRMED")
    log_in_lake = read_arrow(str(lake / "message_log"), schemas.MESSAGE_LOG)
    assert sorted(log_in_lake.column("id").to_pylist()) == log_ids
