"""The audit of a real RabbitMQ: faults made on the broker, found in the lake's audit tables.

One virtual host gets a topic exchange with queues for each fault: a requeued message, a
consumer that dies holding a delivery, a publisher that republishes, a reject into a
dead-letter exchange, a TTL expiry into it, an expiry and a max-length drop without one, a
queue nobody consumes and an unroutable mandatory publish. Publishers and consumers write
their ledgers through the pika hooks; the ledgers and the topology (management API) are
ingested, the audit runs, and its RabbitMQ rows must be exactly what was done.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from pyspark.sql import SparkSession

from broker_runtime.ledger.consumer import ConsumerLedger
from broker_runtime.ledger.producer import ProducerLedger
from broker_runtime.rabbit.consumer import ConsumerLog
from broker_runtime.rabbit.publisher import LedgeredPublisher, Published
from pipeline.delta_io import DeltaIO
from pipeline.jobs.audit import run_audit
from pipeline.jobs.ingest import ingest_ledgers
from pipeline.jobs.rabbit import ingest_topology
from pipeline.lake import AUDIT_TABLES, table_path
from tests.rabbitmq import RabbitNode

pytestmark = pytest.mark.integration

X, DLX = "orders", "dlx"


def _consume(ch: Any, queue: str, n: int, decide: Any) -> list[tuple[str, bool]]:
    """Consume `n` deliveries from `queue`, settling each as `decide(ch, method, props)` does."""
    seen: list[tuple[str, bool]] = []

    def on_message(c: Any, method: Any, props: Any, body: bytes) -> None:
        seen.append((props.message_id, method.redelivered))
        decide(c, method, props)
        if len(seen) >= n:
            c.stop_consuming()

    ch.basic_consume(queue, on_message)
    ch.connection.call_later(30, ch.stop_consuming)
    ch.start_consuming()
    return seen


def _ack(c: Any, method: Any, _props: Any) -> None:
    c.basic_ack(method.delivery_tag)


def _wait_empty(ch: Any, queue: str) -> None:
    deadline = time.monotonic() + 30
    while (
        ch.queue_declare(queue, passive=True).method.message_count and time.monotonic() < deadline
    ):
        time.sleep(0.05)


def make_faults(node: RabbitNode, vhost: str, data: Path) -> dict[tuple[str, str, str], str]:
    """Run the faults; returns the truth: (kind, cause, queue or "") -> msg_id."""
    producer, consumer = ProducerLedger.open(data), ConsumerLedger.open(data)
    params = pika.URLParameters(node.amqp_url(vhost))
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    ch.exchange_declare(X, "topic")
    ch.exchange_declare(DLX, "fanout")
    ch.queue_declare("dead")
    ch.queue_bind("dead", DLX)
    queues = {
        "billing": ("order.#.billing", {}),
        "shipping": ("order.*.ship", {"x-dead-letter-exchange": DLX}),
        "slow": ("order.*.slow", {"x-dead-letter-exchange": DLX, "x-message-ttl": 50}),
        "short": ("order.*.short", {"x-message-ttl": 50}),
        "tiny": ("order.*.tiny", {"x-max-length": 1}),
        "idle": ("order.*.idle", {}),
    }
    for q, (key, args) in queues.items():
        ch.queue_declare(q, arguments=args)
        ch.queue_bind(q, X, key)
    pub = LedgeredPublisher(ch, producer)
    log = ConsumerLog(consumer)

    def send(key: str, name: str) -> str:
        msg_id, what = pub.publish(X, key, name.encode(), pika.BasicProperties(message_id=name))
        assert what is Published.CONFIRMED, (name, what)
        return msg_id

    truth: dict[tuple[str, str, str], str] = {}
    # billing: a consumer that dies holding one, a nack with requeue, a republish.
    send("order.1.billing", "crashed")
    dying = pika.BlockingConnection(params)
    _, props, _ = log.attach(dying.channel()).basic_get("billing")
    assert props.message_id == "crashed"
    dying.close()  # unacknowledged: the broker puts it back
    send("order.2.billing", "requeued")
    republished = pika.BasicProperties(message_id="republished")
    pub.publish(X, "order.3.billing", b"r", republished)
    pub.publish(X, "order.3.billing", b"r", republished)  # as if its confirm had been lost

    def nack_once(c: Any, m: Any, p: Any) -> None:
        if p.message_id == "requeued" and not m.redelivered:
            c.basic_nack(m.delivery_tag, requeue=True)
        else:
            c.basic_ack(m.delivery_tag)

    got = _consume(log.attach(ch), "billing", 5, nack_once)
    assert sorted(got) == [
        ("crashed", True), ("republished", False), ("republished", False),
        ("requeued", False), ("requeued", True),
    ]  # fmt: skip
    truth[("delivered_twice", "requeued", "billing")] = "requeued"
    truth[("delivered_twice", "redelivery_after_restart", "billing")] = "crashed"
    truth[("delivered_twice", "producer_resend", "billing")] = "republished"
    truth[("duplicate_effect", "producer_resend", "billing")] = "republished"

    # shipping: one rejected without requeue -> dlx; slow: expires -> dlx.
    send("order.4.ship", "rejected")
    send("order.5.slow", "ttl-dead")
    _consume(log.attach(ch), "shipping", 1, lambda c, m, p: c.basic_reject(m.delivery_tag, False))
    _wait_empty(ch, "slow")
    dead = _consume(log.attach(ch), "dead", 2, _ack)
    assert sorted(m for m, _ in dead) == ["rejected", "ttl-dead"]
    truth[("dead_lettered", "rejected", "shipping")] = "rejected"
    truth[("dead_lettered", "expired", "slow")] = "ttl-dead"

    # Losses the broker never reports: expired, dropped, never consumed, unroutable.
    send("order.6.short", "expired")
    send("order.7.tiny", "pushed-out")
    send("order.8.tiny", "kept")
    send("order.9.idle", "waiting")
    lost_id, what = pub.publish(X, "misc.none", b"x", pika.BasicProperties(message_id="nowhere"))
    assert what is Published.UNROUTABLE
    _wait_empty(ch, "short")
    _consume(log.attach(ch), "tiny", 1, _ack)
    truth[("expired", "message_ttl", "short")] = "expired"
    truth[("dropped_maxlen", "max_length", "tiny")] = "pushed-out"
    truth[("never_delivered", "not_consumed", "idle")] = "waiting"
    truth[("unroutable", "no_route", "")] = lost_id
    conn.close()
    producer.close()
    consumer.close()
    return truth


@pytest.fixture(scope="module")
def audited(rabbit_node: RabbitNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from pipeline.spark_session import build_spark

    vhost = f"audit-{uuid.uuid4().hex[:8]}"
    rabbit_node.add_vhost(vhost)
    root = tmp_path_factory.mktemp("rabbit-audit")
    data, lake = root / "data", root / "lake"
    lake.mkdir()
    spark: SparkSession = build_spark("mqaudit-rabbit-audit", "local[2]")
    try:
        # Before the exchanges exist (too old for every publish), and after.
        ingest_topology(spark, lake, rabbit_node.api_url, [vhost], progress=False)
        truth = make_faults(rabbit_node, vhost, data)
        ingest_topology(spark, lake, rabbit_node.api_url, [vhost], progress=False)
        appended = ingest_ledgers(spark, lake, data, progress=False)
        summary = run_audit(lake, spark, progress=False)
        io = DeltaIO(spark)
        rows = {
            name: [
                r.asDict()
                for r in io.read(table_path(lake, name), schema).collect()
                if r["system"] == "rabbitmq"
            ]
            for name, schema in AUDIT_TABLES.items()
        }
        yield truth, rows, summary, appended, vhost
    finally:
        spark.stop()
        rabbit_node.delete_vhost(vhost)


def test_findings_are_the_faults_made(audited: Any) -> None:
    truth, rows, _, appended, _ = audited
    found = {
        (r["kind"], r["cause"], r["group"] or ""): r["msg_id"]
        for name in ("audit_duplicates", "audit_losses", "audit_dead_letters")
        for r in rows[name]
    }
    assert found == truth
    assert (appended["message_stub"], appended["message_log"]) == (10, 10)
    assert not any(rows[n] for n in ("audit_lag", "resend_candidates", "consistency"))


def test_finding_rows_name_exchange_vhost_and_death(audited: Any) -> None:
    _, rows, summary, _, vhost = audited
    by = {(r["kind"], r["msg_id"]): r for n in rows for r in rows[n]}
    lost = by[("never_delivered", "waiting")]
    assert (lost["topic"], lost["broker"], lost["group"]) == (X, vhost, "idle")
    dead = by[("dead_lettered", "rejected")]
    assert (dead["topic"], dead["original_topic"], dead["retries"]) == (DLX, X, 1)
    assert '"routing-keys": ["order.4.ship"]' in dead["death"]
    assert (dead["deliveries"], dead["last_outcome"]) == (1, "CONSUMED")
    twice = by[("delivered_twice", "crashed")]
    assert twice["count"] == 2 and "(redelivered)" in twice["detail"]
    assert summary["tables"]["audit_losses"]["kinds"]["unroutable"] == {"no_route": 1}
