"""The consumer's message log for pika consumers, and idempotent consumption.

`channel = ConsumerLog(ledger).attach(channel)` returns the channel wrapped (blocking,
SelectConnection or asyncio channels alike): every delivery that reaches a callback given
to its `basic_consume`, or comes out of its `consume` generator or `basic_get`, gets a
`message_log` row (queue, consumer tag, delivery tag, `redelivered`) before the code sees
it, and its `basic_ack` / `basic_nack` / `basic_reject` (with `multiple`) record the outcome
before the broker is told. Settling on the unwrapped channel leaves the row's outcome NULL,
as does a consumer that dies first.

`IdempotentCallback(effect, store, queue)` is an `on_message_callback` that runs `effect` once per
message id over the consumer ledger's de-dup table (or Redis), as `Idempotent` does for the
RocketMQ consumers: ack without running it when the message was CONSUMED, requeue while
another consumer holds it, ack after a successful effect, requeue after a failed one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from broker_runtime.client.idempotent import DEFAULT_HOLD_MS, Idempotent
from broker_runtime.common.clock import Clock
from broker_runtime.ledger.consumer import ConsumerLedger, Receipt
from broker_runtime.ledger.dedup import DedupStore
from broker_runtime.ledger.producer import body_hash
from broker_runtime.ledger.schema import Settle, System
from broker_runtime.rabbit.publisher import json_of, vhost_of

log = logging.getLogger(__name__)

OnMessage = Callable[[Any, Any, Any, bytes], Any]


def delivery_msg_id(props: Any, body: bytes) -> str:
    """The publish's `message_id`; `sha256:<body hash>` for a message published without one."""
    msg_id = getattr(props, "message_id", None)
    return str(msg_id) if msg_id else f"sha256:{body_hash(body)}"


def delivery_count(method: Any, props: Any) -> int:
    """Earlier deliveries of this message: quorum queues' `x-delivery-count`, else 1 for a
    redelivery and 0 for a first delivery."""
    count = (getattr(props, "headers", None) or {}).get("x-delivery-count")
    if isinstance(count, int):
        return count
    return 1 if method.redelivered else 0


def death_json(props: Any) -> str | None:
    """A dead letter's `x-death` history as JSON (newest first, as the broker keeps it)."""
    death = (getattr(props, "headers", None) or {}).get("x-death")
    return json_of(death) if death else None


class ConsumerLog:
    """Writes the message log of the channels it attaches to."""

    def __init__(self, ledger: ConsumerLedger, *, vhost: str | None = None) -> None:
        self.ledger = ledger
        self.vhost = vhost
        self.errors = 0

    def attach(self, channel: Any) -> LoggedChannel:
        vhost = self.vhost if self.vhost is not None else vhost_of(channel)
        return LoggedChannel(channel, self, vhost)

    def received(self, vhost: str, queue: str, channel_number: int, method: Any, props: Any,
                 body: bytes) -> int | None:  # fmt: skip
        receipt = Receipt(
            delivery_msg_id(props, body), method.exchange, queue,
            str(getattr(method, "consumer_tag", None) or ""), vhost, channel_number,
            int(method.delivery_tag), delivery_count(method, props), System.RABBITMQ,
            method.routing_key, bool(method.redelivered), death_json(props),
        )  # fmt: skip
        try:
            return self.ledger.record_received([receipt])[0]
        except Exception as e:  # consumption goes on; the log misses this delivery
            self.errors += 1
            log.error("delivery %s of %s not logged: %s", receipt.queue_offset, queue, e)
            return None

    def settled(self, rows: list[int], how: Settle, requeue: bool) -> None:
        try:
            self.ledger.record_settled([(r, how, requeue) for r in rows])
        except Exception as e:
            self.errors += 1
            log.error("outcome of %d delivery(ies) not logged: %s", len(rows), e)


class LoggedChannel:
    """A pika channel whose deliveries and settlements are logged; the rest passes through."""

    def __init__(self, channel: Any, log_: ConsumerLog, vhost: str) -> None:
        self._channel = channel
        self._log = log_
        self._vhost = vhost
        self._open: dict[int, int] = {}  # delivery tag -> its message_log row, until settled
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._channel, name)

    @property
    def unwrapped(self) -> Any:
        return self._channel

    def _received(self, queue: str, method: Any, props: Any, body: bytes) -> None:
        number = int(getattr(self._channel, "channel_number", 0))
        row = self._log.received(self._vhost, queue, number, method, props, body)
        if row is not None:
            with self._lock:
                self._open[int(method.delivery_tag)] = row

    def basic_consume(self, queue: str, on_message_callback: OnMessage, *args: Any,
                      **kwargs: Any) -> Any:  # fmt: skip
        def logged(_channel: Any, method: Any, props: Any, body: bytes) -> Any:
            self._received(queue, method, props, body)
            return on_message_callback(self, method, props, body)

        return self._channel.basic_consume(queue, logged, *args, **kwargs)

    def consume(self, queue: str, *args: Any, **kwargs: Any) -> Iterator[Any]:
        """BlockingChannel.consume: (method, properties, body), or Nones on inactivity."""
        for method, props, body in self._channel.consume(queue, *args, **kwargs):
            if method is not None:
                self._received(queue, method, props, body)
            yield method, props, body

    def basic_get(self, queue: str, *args: Any, **kwargs: Any) -> Any:
        """BlockingChannel.basic_get: (method, properties, body) or Nones when empty."""
        method, props, body = self._channel.basic_get(queue, *args, **kwargs)
        if method is not None:
            self._received(queue, method, props, body)
        return method, props, body

    def basic_ack(self, delivery_tag: int = 0, multiple: bool = False) -> Any:
        self._settle(delivery_tag, multiple, Settle.ACK, False)
        return self._channel.basic_ack(delivery_tag, multiple)

    def basic_nack(self, delivery_tag: int = 0, multiple: bool = False,
                   requeue: bool = True) -> Any:  # fmt: skip
        self._settle(delivery_tag, multiple, Settle.NACK, requeue)
        return self._channel.basic_nack(delivery_tag, multiple, requeue)

    def basic_reject(self, delivery_tag: int = 0, requeue: bool = True) -> Any:
        self._settle(delivery_tag, False, Settle.REJECT, requeue)
        return self._channel.basic_reject(delivery_tag, requeue)

    def _settle(self, tag: int, multiple: bool, how: Settle, requeue: bool) -> None:
        with self._lock:
            if multiple:  # tag 0 with multiple: everything outstanding
                tags = [t for t in self._open if tag == 0 or t <= tag]
            else:
                tags = [tag] if tag in self._open else []
            rows = [self._open.pop(t) for t in tags]
        if rows:
            self._log.settled(rows, how, requeue)


@dataclass(frozen=True)
class Delivery:
    """One delivery, as `Idempotent` sees it (`uniq_key` is the message id)."""

    channel: Any
    method: Any
    properties: Any
    body: bytes

    @property
    def uniq_key(self) -> str:
        return delivery_msg_id(self.properties, self.body)

    @property
    def msg_id(self) -> str:
        return self.uniq_key


class IdempotentCallback:
    """An `on_message_callback` running `effect(channel, method, properties, body)` once per
    message id for `queue` (the de-dup group), and settling the delivery itself; `stats`
    counts the effects run, skipped (CONSUMED) and deferred (held elsewhere)."""

    def __init__(
        self,
        effect: Callable[[Any, Any, Any, bytes], object],
        store: DedupStore,
        queue: str,
        *,
        hold_ms: int = DEFAULT_HOLD_MS,
        clock: Clock | None = None,
    ) -> None:
        def run(d: Delivery) -> str:
            effect(d.channel, d.method, d.properties, d.body)
            return "ack"

        self._once: Idempotent[Delivery, str] = Idempotent(
            run, store, queue, success="ack", later="requeue", hold_ms=hold_ms, clock=clock,
            check_group=False,
        )  # fmt: skip
        self.stats = self._once.stats

    def __call__(self, channel: Any, method: Any, props: Any, body: bytes) -> None:
        try:
            verdict = self._once(Delivery(channel, method, props, body))
        except Exception:
            log.exception("effect of %s failed: requeued", delivery_msg_id(props, body))
            verdict = "requeue"
        if verdict == "ack":
            channel.basic_ack(method.delivery_tag)
        else:
            channel.basic_nack(method.delivery_tag, requeue=True)
