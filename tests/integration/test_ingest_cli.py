"""`mqaudit pipeline ingest` as a user runs it: a separate process over a cluster data dir."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from pipeline.lake import INGESTED_TABLES
from tests.conftest import mqaudit_cmd
from tests.unit.pipeline import ledgers
from tests.unit.pipeline.stores import stored, varied, write_store

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_cli_ingests_a_cluster_dir(tmp_path: Path, cli_env: dict[str, str]) -> None:
    data = tmp_path / "data"
    master = data / "stores" / "a-0"
    write_store(master, varied(80))
    shutil.copytree(master, data / "stores" / "a-1")
    nodes = [
        {"role": "namesrv", "host": "127.0.0.1", "port": 1},
        {"role": "master", "broker": "broker-a", "broker_id": 0, "store_dir": "stores/a-0"},
        {"role": "slave", "broker": "broker-a", "broker_id": 1, "store_dir": "stores/a-1"},
    ]
    (data / "cluster.json").write_text(json.dumps({"nodes": nodes}))
    ledgers.create(data, [ledgers.stub(i) for i in range(5)], [])
    lake = tmp_path / "lake"
    cmd = mqaudit_cmd("pipeline", "ingest", "--data-dir", str(data), "--lake", str(lake),
                      "--spark-master", "local[2]", "--range-mb", "1")  # fmt: skip
    run = subprocess.run(cmd, env=cli_env, capture_output=True, text=True, timeout=280)
    assert run.returncode == 0, run.stderr[-3000:]  # 134 would be delta-rs aborting at exit
    summary = json.loads(run.stdout)
    assert summary["messages"] == 160 and summary["run"] == 1 and summary["quarantine"] == {}
    assert "ingest: 2 broker store dir(s)" in run.stderr
    assert "messages" in run.stderr.splitlines()[-1] or "rows" in run.stderr
    counts = {}
    for name in INGESTED_TABLES:
        table = DeltaTable(str(lake / name))
        counts[name] = sum(pq.read_metadata(u).num_rows for u in table.file_uris())
    assert counts["messages"] == counts["consume_queue"] == 2 * len(stored(master))
    assert counts["message_stub"] == 5 and counts["message_log"] == 0
    assert counts["ingest_checkpoint"] == 8  # planned + done, 2 replicas x 2 sources


def test_cli_refuses_a_missing_data_dir(tmp_path: Path, cli_env: dict[str, str]) -> None:
    cmd = mqaudit_cmd(
        "pipeline", "ingest", "--data-dir", str(tmp_path / "no"), "--lake", str(tmp_path)
    )
    run = subprocess.run(cmd, env=cli_env, capture_output=True, text=True, timeout=280)
    assert run.returncode == 2 and "does not exist" in run.stderr
