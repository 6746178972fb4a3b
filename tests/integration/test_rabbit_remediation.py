"""RabbitMQ remediation against a real RabbitMQ and a real lake: dead letters replayed to the
exchange and routing key they died with (dry run first, never twice unless forced, resumed
after an interruption), and an unconfirmed stub published again by the resend job."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pika
import pytest

from broker_runtime.client.model import MQBrokerError
from broker_runtime.common.message import REPLAY_ID_PROPERTY, REPLAY_OF_PROPERTY
from broker_runtime.ledger.consumer import ConsumerLedger
from broker_runtime.ledger.producer import ProducerLedger
from broker_runtime.rabbit.consumer import ConsumerLog
from broker_runtime.rabbit.publisher import LedgeredPublisher, record_stub, stub_of
from pipeline.audit_schemas import RESEND_CANDIDATES
from pipeline.delta_io import DeltaIO
from pipeline.jobs.ledger_ingest import ingest_ledgers
from pipeline.jobs.replay import plan_step, run_replay
from pipeline.lake import DLQ_REPLAY_LOG, RESEND_LOG, TABLES
from pipeline.remediation.rabbit_sender import RabbitClient, RabbitMessage, RabbitTarget
from pipeline.remediation.reasons import failure_reason
from pipeline.remediation.replay_request import ReplayRequest, parse_request
from pipeline.remediation.resend_plan import RESEND_RUN_PROPERTY
from pipeline.transforms.resend import by_system, resend_candidates
from tests.rabbitmq import RabbitNode

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

HEADERS = {"tenant": "t1"}
LEDGERS = ("message_stub", "message_log")


@dataclass
class World:
    node: RabbitNode
    vhost: str
    data: Path
    lake: Path
    spark: Any

    @property
    def target(self) -> RabbitTarget:
        return RabbitTarget(self.node.amqp_url(self.vhost), str(self.data))

    def request(self, queue: str, **kw: Any) -> ReplayRequest:
        params = {"group": queue, "from_time": 0, "dry_run": False, "system": "rabbitmq"}
        return parse_request({**params, **kw})

    def log(self, table: Any, **match: Any) -> list[dict[str, Any]]:
        rows = DeltaIO(self.spark).read(table.path(self.lake), table.schema).collect()
        return [
            r.asDict() for r in rows if all(r[k] == v for k, v in match.items())
        ]  # fmt: skip

    def drain(self, queue: str) -> list[tuple[Any, Any, bytes]]:
        """Every message waiting in `queue` (method, properties, body), acked."""
        conn = pika.BlockingConnection(pika.URLParameters(self.node.amqp_url(self.vhost)))
        try:
            ch, out = conn.channel(), []
            while True:
                method, props, body = ch.basic_get(queue, auto_ack=True)
                if method is None:
                    return out
                out.append((method, props, body))
        finally:
            conn.close()


def _dead_letter(ch: Any, consumer: ConsumerLedger, queue: str, n: int) -> None:
    """Take `n` messages off `queue` and reject them into the DLX, then log them (with their
    x-death) off the dead-letter queue, as a consumer of it would."""
    logged = ConsumerLog(consumer).attach(ch)
    for _ in range(n):
        method, _, _ = logged.basic_get(queue)
        logged.basic_reject(method.delivery_tag, requeue=False)
    got = 0
    deadline = time.monotonic() + 30
    while got < n and time.monotonic() < deadline:  # dead-lettering is asynchronous
        method, _, _ = logged.basic_get("dead")
        if method is not None:
            logged.basic_ack(method.delivery_tag)
            got += 1
    assert got == n


@pytest.fixture(scope="module")
def world(rabbit_node: RabbitNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    from tests.conftest import local_spark

    vhost = f"remedy-{uuid.uuid4().hex[:8]}"
    rabbit_node.add_vhost(vhost)
    root = tmp_path_factory.mktemp("rabbit-remedy")
    data, lake = root / "data", root / "lake"
    spark = local_spark("mqaudit-rabbit-remediation")
    conn = pika.BlockingConnection(pika.URLParameters(rabbit_node.amqp_url(vhost)))
    try:
        ch = conn.channel()
        ch.exchange_declare("orders", "direct")
        ch.exchange_declare("dlx", "fanout")
        ch.queue_declare("dead")
        ch.queue_bind("dead", "dlx")
        for q in ("work", "work2"):
            ch.queue_declare(q, arguments={"x-dead-letter-exchange": "dlx"})
            ch.queue_bind(q, "orders", routing_key=f"to.{q}")
        producer, consumer = ProducerLedger.open(data), ConsumerLedger.open(data)
        kept = LedgeredPublisher(ch, producer, keep_bodies=True)
        for i in range(3):
            props = pika.BasicProperties(message_id=f"d-{i}", headers=HEADERS)
            kept.publish("orders", "to.work", f"body {i}".encode(), props)
        LedgeredPublisher(ch, producer).publish(  # its body is nowhere: not replayable
            "orders", "to.work", b"lost", pika.BasicProperties(message_id="no-body")
        )
        for i in range(2):
            props = pika.BasicProperties(message_id=f"r-{i}", headers=HEADERS)
            kept.publish("orders", "to.work2", f"resume {i}".encode(), props)
        _dead_letter(ch, consumer, "work", 4)
        _dead_letter(ch, consumer, "work2", 2)
        # A publisher that died before its publish was confirmed: the stub stays UNCONFIRMED.
        props = pika.BasicProperties(message_id="u-0", headers=HEADERS)
        record_stub(producer, stub_of("orders", "to.work2", b"unconfirmed", props), b"unconfirmed",
                    True)  # fmt: skip
        producer.close()
        consumer.close()
        ingest_ledgers(spark, lake, data, progress=False)
        yield World(rabbit_node, vhost, data, lake, spark)
    finally:
        conn.close()  # the session stays: it is the worker's, which later files' fixtures hold
        rabbit_node.delete_vhost(vhost)


def test_replay_to_the_original_exchange_once(world: World) -> None:
    dry = run_replay(str(world.lake), world.request("work", dry_run=True), "rr-dry", None,
                     spark=world.spark, progress=False)  # fmt: skip
    assert dry["plan"]["planned"] == 4 and dry["send"] == {"dry_run": True}
    assert world.drain("work") == []  # a dry run sends nothing

    done = run_replay(str(world.lake), world.request("work", messages_per_second=20), "rr-1",
                      world.target, spark=world.spark, progress=False)  # fmt: skip
    assert done["send"]["sent"] == 3 and done["send"]["refused"] == 1
    back = {p.message_id: (m, p, body) for m, p, body in world.drain("work")}
    assert sorted(back) == ["d-0", "d-1", "d-2"]
    method, props, body = back["d-1"]
    assert (method.exchange, method.routing_key, body) == ("orders", "to.work", b"body 1")
    assert props.headers["tenant"] == "t1" and props.headers[REPLAY_ID_PROPERTY] == "rr-1"
    assert props.headers[REPLAY_OF_PROPERTY].startswith("dead#")
    rows = {r["msg_id"]: r for r in world.log(DLQ_REPLAY_LOG, replay_id="rr-1")
            if r["status"] != "planned"}  # fmt: skip
    assert {r["system"] for r in rows.values()} == {"rabbitmq"}
    assert rows["d-0"]["status"] == "sent" and "confirmed by vhost" in rows["d-0"]["reason"]
    assert rows["no-body"]["status"] == "failed" and "no kept body" in rows["no-body"]["reason"]

    again = run_replay(str(world.lake), world.request("work"), "rr-2", world.target,
                       spark=world.spark, progress=False)  # fmt: skip
    assert again["plan"]["skipped_by_reason"] == {"already replayed": 3}
    assert again["send"]["sent"] == 0 and world.drain("work") == []


def test_interrupted_replay_resumes(world: World) -> None:
    request = world.request("work2")
    # The run died after logging its plan, maybe mid-publish: nothing says what was sent.
    plan_step(str(world.lake), request, "rr-crash", spark=world.spark, progress=False)
    resumed = run_replay(str(world.lake), request, "rr-crash", world.target,
                         spark=world.spark, progress=False)  # fmt: skip
    assert resumed["plan"]["new_plan"] is False and resumed["send"]["sent"] == 2
    assert sorted(p.message_id for _, p, _ in world.drain("work2")) == ["r-0", "r-1"]
    reasons = [r["reason"] for r in world.log(DLQ_REPLAY_LOG, replay_id="rr-crash")]
    assert sum(RabbitClient.not_found == r for r in reasons) == 2  # said, not guessed
    assert resumed["by_status"] == {"sent": 2}


def test_resend_publishes_an_unconfirmed_stub_again(world: World) -> None:
    from pipeline.jobs.resend import run_resend

    later = int(time.time() * 1000) + 3_600_000  # the stub's resend time has come
    io = DeltaIO(world.spark)
    stubs, log = (io.read(TABLES[t].path(world.lake), TABLES[t].schema) for t in LEDGERS)
    due = by_system(resend_candidates, stubs, log, 16, later)  # the audit's table, alone
    io.overwrite(due, TABLES["resend_candidates"].path(world.lake), RESEND_CANDIDATES)
    done = run_resend(str(world.lake), world.data, None, as_of_ms=later, run_id="rs-1",
                      rabbit=world.target, spark=world.spark, progress=False)  # fmt: skip
    assert done["counts"]["sent"] == 1
    ((method, props, body),) = world.drain("work2")
    assert (props.message_id, body, method.routing_key) == ("u-0", b"unconfirmed", "to.work2")
    assert props.headers == {**HEADERS, RESEND_RUN_PROPERTY: "rs-1"}
    (row,) = world.log(RESEND_LOG, run_id="rs-1")
    assert (row["action"], row["system"], row["broker"]) == ("sent", "rabbitmq", world.vhost)
    stub = ProducerLedger.open(world.data).get("u-0")
    assert stub is not None and stub["status"] == "CONFIRMED"

    again = run_resend(str(world.lake), world.data, None, as_of_ms=later, run_id="rs-2",
                       rabbit=world.target, spark=world.spark, progress=False)  # fmt: skip
    assert again["counts"]["sent"] == 0 and world.drain("work2") == []


def test_the_sender_tells_refusals_from_sends(world: World) -> None:
    with RabbitClient(world.node.amqp_url(world.vhost)) as client:
        with pytest.raises(MQBrokerError) as gone:  # the broker closes the channel: 404
            client.deliver(RabbitMessage("nowhere", "k", b"x", "s-0"))
        assert failure_reason(gone.value).startswith("refused") and "404" in str(gone.value)
        with pytest.raises(MQBrokerError, match="returned unrouted"):
            client.deliver(RabbitMessage("orders", "no.queue", b"x", "s-1"))
        where, stored = client.deliver(RabbitMessage("orders", "to.work", b"x", "s-2"))
    assert stored == (world.vhost, None, None) and "exchange 'orders'" in where
    assert [p.message_id for _, p, _ in world.drain("work")] == ["s-2"]
