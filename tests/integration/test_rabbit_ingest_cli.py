"""`mqaudit pipeline ingest-rabbit` against a real RabbitMQ: topology and ledgers in the lake."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pika
import pyarrow.dataset as ds
import pytest
from deltalake import DeltaTable

from broker_runtime.ledger.producer import ProducerLedger
from broker_runtime.rabbit.publisher import LedgeredPublisher
from pipeline.jobs.rabbit import api_credentials
from tests.rabbitmq import RabbitNode

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]  # Spark at load 20: minutes


def table(lake: Path, name: str) -> list[dict[str, object]]:
    files = DeltaTable(str(lake / name)).file_uris()
    return ds.dataset(files, format="parquet").to_table().to_pylist() if files else []


def test_ingest_rabbit_snapshots_topology_and_ledgers(
    rabbit_node: RabbitNode, rabbit_vhost: str, tmp_path: Path
) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(rabbit_node.amqp_url(rabbit_vhost)))
    ch = conn.channel()
    ch.exchange_declare("events", "headers", arguments={"alternate-exchange": "rest"})
    ch.queue_declare("eu", arguments={"x-message-ttl": 500, "x-dead-letter-exchange": "dlx"})
    ch.queue_bind("eu", "events", arguments={"x-match": "any", "region": "eu", "vip": None})
    producer = ProducerLedger.open(tmp_path / "data")
    LedgeredPublisher(ch, producer).publish(
        "events", "", b"e", pika.BasicProperties(message_id="E1", headers={"region": "eu"})
    )
    producer.close()
    conn.close()
    lake = tmp_path / "lake"
    api = rabbit_node.api_url.replace("http://", "http://guest:guest@")
    cmd = [sys.executable, "-m", "pipeline.cli", "ingest-rabbit", "--lake", str(lake),
           "--api", api, "--vhost", rabbit_vhost, "--data-dir", str(tmp_path / "data"),
           "--spark-master", "local[1]", "--quiet"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["vhosts"] == [rabbit_vhost] and summary["message_stub"] == 1
    rows = {(r["kind"], r["name"]): r for r in table(lake, "rabbit_topology")}
    assert rows[("exchange", "events")]["alternate"] == "rest"
    eu = rows[("queue", "eu")]
    assert (eu["message_ttl"], eu["dead_letter_exchange"], eu["vhost"]) == (
        500,
        "dlx",
        rabbit_vhost,
    )
    (binding,) = [
        r for (kind, _), r in rows.items() if kind == "binding" and r["source"] == "events"
    ]
    assert json.loads(str(binding["arguments"])) == {"region": "eu", "vip": None, "x-match": "any"}
    (stub,) = table(lake, "message_stub")
    assert (stub["msg_id"], stub["system"], stub["headers"]) == (
        "E1",
        "rabbitmq",
        '{"region": "eu"}',
    )

    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and json.loads(again.stdout)["message_stub"] == 0
    assert len({r["snapshot_ts"] for r in table(lake, "rabbit_topology")}) == 2


def test_api_credentials() -> None:
    assert api_credentials("http://u:p%40ss@h:15672/api") == ("http://h:15672/api", "u", "p@ss")
    assert api_credentials("https://h/api")[1:] == ("guest", "guest")
    with pytest.raises(ValueError, match="http"):
        api_credentials("h:15672")
