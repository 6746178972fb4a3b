"""RabbitMQ fault scenarios with their ground truth, on a real broker through the pika hooks.

`run_rabbit_faults(amqp_url, data_dir, seed)` declares, in the URL's virtual host, a topic
exchange `orders` with a queue per fault and a fanout dead-letter exchange `dlx` (queue
`dead`), then makes each fault happen to 1-3 messages (the seed picks how many): a consumer
that dies holding deliveries, a nack with requeue, a publisher that publishes again after a
lost confirm, a reject without requeue into the DLX, a message TTL into the DLX, a TTL and a
max-length drop without a DLX, a queue nobody consumes and an unroutable mandatory publish.
Given `snapshot` (called when the topology is about to be relied on: before and after it
changes), also a binding removed while publishing: on a direct exchange `events`, queues
`live` and `copy` take key `e`; messages published before `copy` is unbound had to reach
both, those after only `live`; `live` is consumed, `copy` never is. The audit judges routing
under the bindings of the publish's time, so it must find the first ones, and only them,
never delivered from `copy`; without snapshots of those times it cannot (the scenario is
left out).
Publishers and consumers write their ledgers under `data_dir` (LedgeredPublisher,
ConsumerLog), and the truth is what the audit must find: a list of findings
`{"kind", "cause", "group", "msg_id"}` (`group` the queue, None for an unroutable publish).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker_runtime.common import findings as f
from broker_runtime.ledger.consumer import ConsumerLedger
from broker_runtime.ledger.producer import ProducerLedger
from broker_runtime.rabbit.consumer import ConsumerLog
from broker_runtime.rabbit.publisher import LedgeredPublisher, Published

EXCHANGE, DLX, DEAD = "orders", "dlx", "dead"
EVENTS, LIVE, COPY = "events", "live", "copy"  # the binding removed while publishing
TTL_MS = 50
WAIT_S = 30.0
# queue -> (binding key on `orders`, queue arguments)
QUEUES: dict[str, tuple[str, dict[str, Any]]] = {
    "billing": ("order.#.billing", {}),
    "shipping": ("order.*.ship", {"x-dead-letter-exchange": DLX}),
    "slow": ("order.*.slow", {"x-dead-letter-exchange": DLX, "x-message-ttl": TTL_MS}),
    "short": ("order.*.short", {"x-message-ttl": TTL_MS}),
    "tiny": ("order.*.tiny", {"x-max-length": 1}),
    "idle": ("order.*.idle", {}),
}
Settle = Callable[[Any, Any, Any], None]
Truth = list[dict[str, Any]]


def _fact(kind: str, cause: str, group: str | None, msg_id: str) -> dict[str, Any]:
    return {"kind": kind, "cause": cause, "group": group, "msg_id": msg_id}


def _consume(ch: Any, queue: str, n: int, settle: Settle) -> list[tuple[str, bool]]:
    """`n` deliveries from `queue`, each settled by `settle(channel, method, properties)`."""
    seen: list[tuple[str, bool]] = []
    if n == 0:
        return seen

    def on_message(c: Any, method: Any, props: Any, _body: bytes) -> None:
        seen.append((props.message_id, method.redelivered))
        settle(c, method, props)
        if len(seen) >= n:
            c.stop_consuming()

    tag = ch.basic_consume(queue, on_message)
    timer = ch.connection.call_later(WAIT_S, ch.stop_consuming)
    ch.start_consuming()
    ch.connection.remove_timeout(timer)
    ch.basic_cancel(tag)
    if len(seen) < n:
        raise RuntimeError(f"{queue}: {len(seen)} of {n} deliveries in {WAIT_S} s")
    return seen


def _ack(c: Any, method: Any, _props: Any) -> None:
    c.basic_ack(method.delivery_tag)


def _wait_empty(ch: Any, queue: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while ch.queue_declare(queue, passive=True).method.message_count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{queue} did not empty in {WAIT_S} s")
        time.sleep(0.02)


def _after(ms: int) -> None:
    """Wait for the clock to pass `ms` (a snapshot must be later than what came before)."""
    while time.time_ns() // 1_000_000 <= ms:
        time.sleep(0.001)


def run_rabbit_faults(
    amqp_url: str, data_dir: Path, seed: int, snapshot: Callable[[], None] | None = None
) -> Truth:
    """Make the faults (see module doc); returns the truth."""
    import pika

    rng = random.Random(seed)
    n = {k: rng.randint(1, 3) for k in ("crash", "requeue", "republish", "reject", "ttl_dead",
                                         "expire", "drop", "idle", "unroutable",
                                         "rebind")}  # fmt: skip
    producer, consumer = ProducerLedger.open(data_dir), ConsumerLedger.open(data_dir)
    params = pika.URLParameters(amqp_url)
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        ch.exchange_declare(EXCHANGE, "topic")
        ch.exchange_declare(DLX, "fanout")
        ch.queue_declare(DEAD)
        ch.queue_bind(DEAD, DLX)
        for q, (key, args) in QUEUES.items():
            ch.queue_declare(q, arguments=args)
            ch.queue_bind(q, EXCHANGE, key)
        pub = LedgeredPublisher(ch, producer)
        log = ConsumerLog(consumer)
        truth: Truth = []

        def send(key: str, msg_id: str, times: int = 1) -> str:
            props = pika.BasicProperties(message_id=msg_id)
            for _ in range(times):
                what = pub.publish(EXCHANGE, key, msg_id.encode(), props)[1]
                if what is not Published.CONFIRMED:
                    raise RuntimeError(f"{msg_id} to {key}: {what}")
            return msg_id

        def ids(kind: str) -> list[str]:
            return [f"{kind}-{seed}-{i}" for i in range(n[kind])]

        # billing: consumers that die holding deliveries, nacks with requeue, republishes.
        crashed = [send("order.1.billing", m) for m in ids("crash")]
        dying = pika.BlockingConnection(params)
        dch = log.attach(dying.channel())
        for m in crashed:
            _, props, _ = dch.basic_get("billing")
            assert props.message_id == m
        dying.close()  # unacknowledged: the broker delivers them again
        requeued = [send("order.2.billing", m) for m in ids("requeue")]
        republished = [send("order.3.billing", m, times=2) for m in ids("republish")]

        def nack_once(c: Any, method: Any, props: Any) -> None:
            if props.message_id in requeued and not method.redelivered:
                c.basic_nack(method.delivery_tag, requeue=True)
            else:
                c.basic_ack(method.delivery_tag)

        total = len(crashed) + 2 * len(requeued) + 2 * len(republished)
        _consume(log.attach(ch), "billing", total, nack_once)
        truth += [
            _fact(f.DELIVERED_TWICE, f.REDELIVERY_AFTER_RESTART, "billing", m) for m in crashed
        ]
        truth += [_fact(f.DELIVERED_TWICE, f.REQUEUED, "billing", m) for m in requeued]
        for m in republished:
            truth += [
                _fact(f.DELIVERED_TWICE, f.PRODUCER_RESEND, "billing", m),
                _fact(f.DUPLICATE_EFFECT, f.PRODUCER_RESEND, "billing", m),
            ]

        # Into the dead-letter exchange: rejected without requeue; expired with a DLX.
        rejected = [send("order.4.ship", m) for m in ids("reject")]
        ttl_dead = [send("order.5.slow", m) for m in ids("ttl_dead")]
        _consume(
            log.attach(ch), "shipping", len(rejected),
            lambda c, m, p: c.basic_reject(m.delivery_tag, requeue=False),
        )  # fmt: skip
        _wait_empty(ch, "slow")
        _consume(log.attach(ch), DEAD, len(rejected) + len(ttl_dead), _ack)
        truth += [_fact(f.DEAD_LETTERED, "rejected", "shipping", m) for m in rejected]
        truth += [_fact(f.DEAD_LETTERED, "expired", "slow", m) for m in ttl_dead]

        # Losses the broker does not report.
        expired = [send("order.6.short", m) for m in ids("expire")]
        dropped = [send("order.7.tiny", m) for m in ids("drop")]
        send("order.7.tiny", f"kept-{seed}")  # the newest: it pushes the others out
        waiting = [send("order.9.idle", m) for m in ids("idle")]
        unroutable = []
        for m in ids("unroutable"):
            what = pub.publish(EXCHANGE, "misc.none", b"x", pika.BasicProperties(message_id=m))[1]
            if what is not Published.UNROUTABLE:
                raise RuntimeError(f"{m}: {what}, not returned")
            unroutable.append(m)
        _wait_empty(ch, "short")
        _consume(log.attach(ch), "tiny", 1, _ack)
        truth += [_fact(f.EXPIRED, f.MESSAGE_TTL, "short", m) for m in expired]
        truth += [_fact(f.DROPPED_MAXLEN, f.MAX_LENGTH, "tiny", m) for m in dropped]
        truth += [_fact(f.NEVER_DELIVERED, f.NOT_CONSUMED, "idle", m) for m in waiting]
        truth += [_fact(f.UNROUTABLE, f.NO_ROUTE, None, m) for m in unroutable]
        if snapshot is not None:
            truth += _binding_removed(ch, pub, log, ids("rebind"), snapshot)
        return truth
    finally:
        if conn.is_open:
            conn.close()
        producer.close()
        consumer.close()


def _binding_removed(
    ch: Any, pub: LedgeredPublisher, log: ConsumerLog, ids: list[str], snapshot: Callable[[], None]
) -> Truth:
    """`copy` unbound from `events` between two batches of publishes (see module doc)."""
    import pika

    ch.exchange_declare(EVENTS, "direct")
    for q in (LIVE, COPY):
        ch.queue_declare(q)
        ch.queue_bind(q, EVENTS, "e")
    snapshot()

    def send(msg_id: str) -> None:
        what = pub.publish(EVENTS, "e", msg_id.encode(), pika.BasicProperties(message_id=msg_id))
        if what[1] is not Published.CONFIRMED:
            raise RuntimeError(f"{msg_id}: {what[1]}")

    before = [f"{m}-a" for m in ids]
    for m in before:
        send(m)
    sent_ms = time.time_ns() // 1_000_000
    ch.queue_unbind(COPY, EVENTS, "e")
    _after(sent_ms)
    snapshot()
    after = [f"{m}-b" for m in ids]
    for m in after:
        send(m)
    _consume(log.attach(ch), LIVE, len(before) + len(after), _ack)
    return [_fact(f.NEVER_DELIVERED, f.NOT_CONSUMED, COPY, m) for m in before]
