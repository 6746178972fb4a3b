"""Ledger hooks for pika publishers and consumers, against a real RabbitMQ node."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from broker_runtime.ledger.consumer import ConsumerLedger
from broker_runtime.ledger.dedup import SqlDedupStore
from broker_runtime.ledger.producer import ProducerLedger, body_hash
from broker_runtime.rabbit.consumer import ConsumerLog, IdempotentCallback
from broker_runtime.rabbit.publisher import AsyncLedgeredPublisher, LedgeredPublisher, Published
from tests.rabbitmq import RabbitNode

pytestmark = pytest.mark.integration


@pytest.fixture
def channel(rabbit_node: RabbitNode, rabbit_vhost: str) -> Iterator[Any]:
    conn = pika.BlockingConnection(pika.URLParameters(rabbit_node.amqp_url(rabbit_vhost)))
    yield conn.channel()
    if conn.is_open:
        conn.close()


@pytest.fixture
def producer(tmp_path: Path) -> Iterator[ProducerLedger]:
    ledger = ProducerLedger.open(tmp_path)
    yield ledger
    ledger.close()


@pytest.fixture
def consumer(tmp_path: Path) -> Iterator[ConsumerLedger]:
    ledger = ConsumerLedger.open(tmp_path)
    yield ledger
    ledger.close()


def test_publisher_stubs_confirmed_unroutable_and_nacked(
    channel: Any, producer: ProducerLedger, rabbit_vhost: str
) -> None:
    channel.exchange_declare("orders", "topic")
    channel.queue_declare("paid")
    channel.queue_bind("paid", "orders", "order.*.paid")
    # A queue that refuses what it has no room for: the broker nacks the publish.
    channel.queue_declare("tiny", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    pub = LedgeredPublisher(channel, producer)
    props = pika.BasicProperties(message_id="M-1", headers={"region": "eu", "n": 3})

    assert pub.publish("orders", "order.7.paid", b"paid 7", props) == ("M-1", Published.CONFIRMED)
    ok = producer.get("M-1")
    assert ok is not None
    assert ok["status"] == "CONFIRMED" and ok["system"] == "rabbitmq"
    assert (ok["topic"], ok["routing_key"], ok["broker"]) == (
        "orders",
        "order.7.paid",
        rabbit_vhost,
    )
    assert json.loads(ok["headers"]) == {"n": 3, "region": "eu"}
    assert ok["body_hash"] == body_hash(b"paid 7") and ok["return_reason"] is None

    lost_id, what = pub.publish("orders", "order.7.shipped", b"nobody listens")
    assert what is Published.UNROUTABLE and len(lost_id) == 32  # a client id was given
    lost = producer.get(lost_id)
    assert lost is not None
    assert (lost["status"], lost["return_reason"]) == ("CONFIRMED", "NO_ROUTE")

    assert pub.publish("", "tiny", b"fits")[1] is Published.CONFIRMED
    refused_id, what = pub.publish("", "tiny", b"does not fit")
    assert what is Published.NACKED
    refused = producer.get(refused_id)
    assert refused is not None and refused["status"] == "UNCONFIRMED"
    _, _, body = channel.basic_get("paid", auto_ack=True)
    assert body == b"paid 7"


def test_consumer_log_per_delivery_with_settlement(
    channel: Any, producer: ProducerLedger, consumer: ConsumerLedger, rabbit_vhost: str
) -> None:
    channel.queue_declare("work")
    pub = LedgeredPublisher(channel, producer)
    for i in range(4):
        pub.publish("", "work", f"job {i}".encode(), pika.BasicProperties(message_id=f"J{i}"))
    logged = ConsumerLog(consumer).attach(channel)
    seen: list[tuple[str, bool]] = []

    def on_message(ch: Any, method: Any, props: Any, body: bytes) -> None:
        seen.append((props.message_id, method.redelivered))
        if props.message_id == "J0" and not method.redelivered:
            ch.basic_nack(method.delivery_tag, requeue=True)  # comes back, redelivered
        elif props.message_id == "J1":
            ch.basic_reject(method.delivery_tag, requeue=False)  # dropped (no DLX)
        else:
            ch.basic_ack(method.delivery_tag)
        if len(seen) == 5:
            ch.stop_consuming()

    tag = logged.basic_consume("work", on_message)
    channel.connection.call_later(30, channel.stop_consuming)
    channel.start_consuming()
    assert sorted(seen) == [
        ("J0", False),
        ("J0", True),
        ("J1", False),
        ("J2", False),
        ("J3", False),
    ]

    rows = consumer.rows()
    assert len(rows) == 5
    assert {r["system"] for r in rows} == {"rabbitmq"}
    assert {(r["group"], r["topic"], r["client_id"], r["broker"]) for r in rows} == {
        ("work", "", tag, rabbit_vhost)
    }
    by = {(r["msg_id"], r["redelivered"]): r for r in rows}
    first, again = by[("J0", False)], by[("J0", True)]
    assert (first["settle"], first["requeue"], first["outcome"]) == (
        "nack",
        True,
        "RECONSUME_LATER",
    )
    assert (again["settle"], again["outcome"], again["reconsume_times"]) == ("ack", "CONSUMED", 1)
    assert again["queue_offset"] > first["queue_offset"]  # delivery tags
    rejected = by[("J1", False)]
    assert (rejected["settle"], rejected["requeue"], rejected["outcome"]) == (
        "reject",
        False,
        "FAILED",
    )
    assert all(r["finished_at"] is not None and r["routing_key"] == "work" for r in rows)


def test_generator_basic_get_and_multiple_ack(
    channel: Any, producer: ProducerLedger, consumer: ConsumerLedger
) -> None:
    channel.queue_declare("batch")
    pub = LedgeredPublisher(channel, producer)
    ids = [pub.publish("", "batch", f"b{i}".encode())[0] for i in range(4)]
    logged = ConsumerLog(consumer).attach(channel)
    method, props, _ = logged.basic_get("batch")
    got = [props.message_id]
    for delivered, props, _ in logged.consume("batch", inactivity_timeout=5):
        method = delivered
        got.append(props.message_id)
        if len(got) == 3:
            break
    logged.basic_ack(method.delivery_tag, multiple=True)  # the first three
    logged.cancel()
    assert got == ids[:3]
    rows = consumer.rows()
    assert [(r["msg_id"], r["outcome"], r["settle"]) for r in rows] == [
        (m, "CONSUMED", "ack") for m in ids[:3]
    ]
    assert rows[0]["client_id"] == ""  # basic_get has no consumer tag


def test_idempotent_callback_runs_a_republished_message_once(
    channel: Any, producer: ProducerLedger, tmp_path: Path
) -> None:
    """A publisher that lost its confirm publishes again: two copies, one effect."""
    channel.queue_declare("pay")
    for _ in range(2):
        channel.basic_publish("", "pay", b"charge 10", pika.BasicProperties(message_id="PAY-1"))
    channel.basic_publish("", "pay", b"charge 20", pika.BasicProperties(message_id="PAY-2"))
    store = SqlDedupStore.open(tmp_path)
    effects: list[bytes] = []
    done: list[int] = []

    def charge(ch: Any, method: Any, props: Any, body: bytes) -> None:
        effects.append(body)

    once = IdempotentCallback(charge, store, "pay.queue")

    def counted(ch: Any, method: Any, props: Any, body: bytes) -> None:
        once(ch, method, props, body)
        done.append(1)
        if len(done) == 3:
            ch.stop_consuming()

    channel.basic_consume("pay", counted)
    channel.connection.call_later(30, channel.stop_consuming)
    channel.start_consuming()
    assert effects == [b"charge 10", b"charge 20"]
    assert (once.stats.ran, once.stats.skipped) == (2, 1)
    assert store.status("pay.queue", "PAY-1") is not None
    assert channel.queue_declare("pay", passive=True).method.message_count == 0
    store.close()


def test_async_publisher_on_a_select_connection(
    rabbit_node: RabbitNode, rabbit_vhost: str, producer: ProducerLedger
) -> None:
    settled: dict[str, Published] = {}
    state: dict[str, Any] = {}
    params = pika.URLParameters(rabbit_node.amqp_url(rabbit_vhost))

    def on_settled(msg_id: str, what: Published) -> None:
        settled[msg_id] = what
        if len(settled) == 6:
            state["conn"].close()

    def on_queue(_frame: Any) -> None:
        pub = AsyncLedgeredPublisher(state["ch"], producer, on_settled=on_settled)
        state["ids"] = [pub.publish("", "aq", f"a{i}".encode()) for i in range(5)]
        state["lost"] = pub.publish("", "no-such-queue", b"lost")

    def on_channel(ch: Any) -> None:
        state["ch"] = ch
        ch.queue_declare("aq", callback=on_queue)

    def on_open(conn: Any) -> None:
        conn.channel(on_open_callback=on_channel)

    conn = pika.SelectConnection(
        params, on_open_callback=on_open, on_close_callback=lambda *_: conn.ioloop.stop()
    )
    state["conn"] = conn
    conn.ioloop.call_later(30, conn.ioloop.stop)
    conn.ioloop.start()
    conn.ioloop.close()  # its wake-up socket pair
    assert {settled[m] for m in state["ids"]} == {Published.CONFIRMED}
    assert settled[state["lost"]] is Published.UNROUTABLE
    for m in state["ids"]:
        row = producer.get(m)
        assert row is not None and (row["status"], row["broker"]) == ("CONFIRMED", rabbit_vhost)
    lost = producer.get(state["lost"])
    assert lost is not None and lost["return_reason"] == "NO_ROUTE"


def test_rabbit_workload_command_writes_truth_and_ledgers(
    rabbit_node: RabbitNode, rabbit_vhost: str, tmp_path: Path
) -> None:
    import subprocess
    import sys

    truth = tmp_path / "truth.json"
    done = subprocess.run(
        [sys.executable, "-m", "broker_runtime.cli.main", "rabbit-workload",
         "--amqp", rabbit_node.amqp_url(rabbit_vhost), "--data-dir", str(tmp_path),
         "--truth", str(truth), "--seed", "7"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(truth.read_text())
    counts = json.loads(done.stdout.splitlines()[-1])["findings"]
    assert doc["seed"] == 7 and sum(counts.values()) == len(doc["findings"])
    assert set(counts) == {
        "delivered_twice", "duplicate_effect", "dead_lettered", "expired", "dropped_maxlen",
        "never_delivered", "unroutable",
    }  # fmt: skip
    ledger = ConsumerLedger.open(tmp_path)
    rows = ledger.rows()
    ledger.close()
    dead = [r for r in rows if r["group"] == "dead"]
    assert dead and all(r["death"] and r["system"] == "rabbitmq" for r in dead)
    conn = pika.BlockingConnection(pika.URLParameters(rabbit_node.amqp_url(rabbit_vhost)))
    idle = conn.channel().queue_declare("idle", passive=True).method.message_count
    conn.close()
    assert idle == counts["never_delivered"]  # still waiting there: a loss only if nobody comes


def test_rabbit_workload_command_starts_and_stops_a_node_of_its_own(tmp_path: Path) -> None:
    import subprocess
    import sys

    import psutil

    from broker_runtime.rabbit.node import RABBIT_BIN, rabbitmq_available
    from tests.db_servers import _unavailable

    cmd = [sys.executable, "-m", "broker_runtime.cli.main", "rabbit-workload",
           "--data-dir", str(tmp_path), "--truth", str(tmp_path / "truth.json")]  # fmt: skip
    for bad in ([], ["--start-node", "--amqp", "amqp://guest:guest@127.0.0.1:1/"]):
        refused = subprocess.run([*cmd, *bad], capture_output=True, text=True, timeout=60)
        assert refused.returncode == 2 and "one of --amqp URL and --start-node" in refused.stderr
    assert not (tmp_path / "truth.json").exists()
    if not rabbitmq_available():
        _unavailable(f"RabbitMQ ({RABBIT_BIN}/rabbitmq-server)")
    done = subprocess.run([*cmd, "--start-node", "--seed", "3"], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.splitlines()[-1])
    assert summary["node"].startswith("mqaudit") and "stopping node" in done.stderr
    doc = json.loads((tmp_path / "truth.json").read_text())
    assert (
        sum(summary["findings"].values()) == len(doc["findings"]) and len(summary["findings"]) == 7
    )
    rows = ConsumerLedger.open(tmp_path)
    assert {r["system"] for r in rows.rows()} == {"rabbitmq"}
    rows.close()
    node_dir = str(tmp_path / "rabbitmq")
    assert (tmp_path / "rabbitmq" / "server.log").is_file()
    left = [  # the node (its beam runs with the node dir on its command line) was stopped
        p.info["pid"]
        for p in psutil.process_iter(["pid", "cmdline"])
        if any(node_dir in a for a in p.info["cmdline"] or ())
    ]
    assert left == []
