"""Producer stubs for pika publishers: a stub before each publish, confirmed on the broker's ack.

`LedgeredPublisher(channel, ledger)` wraps a `BlockingChannel` (it turns publisher confirms
on): `publish(...)` records the stub (UNCONFIRMED), publishes, and on the broker's ack marks
it CONFIRMED; a nack, a timeout or a lost connection leave it UNCONFIRMED for the resend job;
a mandatory publish the broker returns unrouted (it acks it afterwards) is CONFIRMED with its
`return_reason`, the audit's `unroutable`. With `keep_bodies=True` the body is kept in the
ledger with the stub, for the resend of an unconfirmed stub and the DLQ replay (the lake
holds no RabbitMQ bodies). `AsyncLedgeredPublisher` does the same on the channel of a
`SelectConnection` or `AsyncioConnection`, from the confirm and return callbacks (delivery
tags count the channel's publishes, as the broker numbers them).

A stub's msg_id is the publish's `message_id` (one is set, in the client id format, when the
properties have none); `topic` is the exchange, `broker` the virtual host. Ledger writes
happen on the caller's thread (for the async publisher: on the I/O loop, one small
transaction per publish and per confirm).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from broker_runtime.client.msg_id import default_generator
from broker_runtime.ledger.producer import Confirmation, ProducerLedger, StubRecord, body_hash
from broker_runtime.ledger.schema import System

log = logging.getLogger(__name__)


class Published(StrEnum):
    CONFIRMED = "CONFIRMED"  # the broker acked it: stored in every queue it routed to
    UNROUTABLE = "UNROUTABLE"  # returned (mandatory, no queue) and then acked
    NACKED = "NACKED"  # the broker refused it: the stub stays UNCONFIRMED


def vhost_of(channel: Any) -> str:
    """The virtual host of a pika channel's connection ("/" when it cannot be told)."""
    conn = getattr(channel, "connection", None)
    impl = getattr(conn, "_impl", conn)  # BlockingConnection wraps the adapter's connection
    params = getattr(impl, "params", None)
    return str(getattr(params, "virtual_host", "/"))


def json_of(value: Any) -> str:
    """AMQP field values as JSON with sorted keys (bytes, times and the rest as strings)."""

    def plain(v: Any) -> Any:
        return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)

    return json.dumps(value, sort_keys=True, default=plain)


def headers_json(headers: dict[str, Any] | None) -> str | None:
    """The stub's `headers` (None when the publish has none)."""
    return json_of(headers) if headers else None


def with_message_id(properties: Any) -> Any:
    """The publish's properties with a `message_id` (a new one when missing)."""
    import pika

    props = properties if properties is not None else pika.BasicProperties()
    if not props.message_id:
        props.message_id = default_generator().create()
    return props


def stub_of(exchange: str, routing_key: str, body: bytes, props: Any) -> StubRecord:
    """The stub of a publish whose properties carry its `message_id`."""
    return StubRecord(
        props.message_id, exchange, body_hash(body),
        system=System.RABBITMQ, routing_key=routing_key, headers=headers_json(props.headers),
    )  # fmt: skip


def record_stub(ledger: ProducerLedger, stub: StubRecord, body: bytes, keep_body: bool) -> None:
    """The stub before the publish, and the body with it when kept."""
    ledger.record_before_send([stub])
    if keep_body:
        ledger.keep_bodies_of([(stub.msg_id, body)])


class LedgeredPublisher:
    """Publishes on a blocking channel with a stub before and its confirmation after."""

    def __init__(
        self,
        channel: Any,
        ledger: ProducerLedger,
        *,
        vhost: str | None = None,
        keep_bodies: bool = False,
    ) -> None:
        self.channel = channel
        self.ledger = ledger
        self.vhost = vhost if vhost is not None else vhost_of(channel)
        self.keep_bodies = keep_bodies
        if not getattr(channel, "_delivery_confirmation", False):
            channel.confirm_delivery()

    def publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: Any = None,
        *,
        mandatory: bool = True,
    ) -> tuple[str, Published]:
        """(msg_id, what the broker said). Errors of the connection propagate, the stub
        left UNCONFIRMED; a stub that cannot be written fails the publish before it is sent."""
        from pika.exceptions import NackError, UnroutableError

        props = with_message_id(properties)
        msg_id = str(props.message_id)
        record_stub(
            self.ledger, stub_of(exchange, routing_key, body, props), body, self.keep_bodies
        )
        try:
            self.channel.basic_publish(exchange, routing_key, body, props, mandatory=mandatory)
        except UnroutableError as e:
            reason = e.messages[0].method.reply_text if e.messages else "NO_ROUTE"
            self._settled(msg_id, reason)
            return msg_id, Published.UNROUTABLE
        except NackError:
            log.warning("publish %s nacked by the broker: its stub stays unconfirmed", msg_id)
            return msg_id, Published.NACKED
        self._settled(msg_id, None)
        return msg_id, Published.CONFIRMED

    def _settled(self, msg_id: str, returned: str | None) -> None:
        try:
            if returned is not None:
                self.ledger.mark_returned([(msg_id, returned)])
            self.ledger.confirm([Confirmation(msg_id, self.vhost, None, None)])
        except Exception as e:  # the broker has the message; an unconfirmed stub means a resend
            log.error("stub of %s not confirmed (it may be resent): %s", msg_id, e)


@dataclass
class _Pending:
    msg_id: str
    returned: str | None = None


class AsyncLedgeredPublisher:
    """The same on an asynchronous channel (SelectConnection, AsyncioConnection).

    Call it once the channel is open; it turns confirms on and registers its callbacks.
    `on_settled(msg_id, Published)` is called for each publish the broker answered;
    `pending()` lists those it has not (left UNCONFIRMED if the connection goes away).
    """

    def __init__(
        self,
        channel: Any,
        ledger: ProducerLedger,
        *,
        vhost: str | None = None,
        on_settled: Callable[[str, Published], None] | None = None,
        keep_bodies: bool = False,
    ) -> None:
        self.channel = channel
        self.ledger = ledger
        self.keep_bodies = keep_bodies
        self.vhost = vhost if vhost is not None else vhost_of(channel)
        self.on_settled = on_settled
        self._next_tag = 1
        self._pending: dict[int, _Pending] = {}
        self._by_id: dict[str, _Pending] = {}
        channel.confirm_delivery(self._on_confirm)
        channel.add_on_return_callback(self._on_return)

    def publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: Any = None,
        *,
        mandatory: bool = True,
    ) -> str:
        """Record the stub, publish; returns the msg_id (the broker answers later)."""
        props = with_message_id(properties)
        msg_id = str(props.message_id)
        record_stub(
            self.ledger, stub_of(exchange, routing_key, body, props), body, self.keep_bodies
        )
        self.channel.basic_publish(exchange, routing_key, body, props, mandatory=mandatory)
        pending = _Pending(msg_id)
        self._pending[self._next_tag] = pending
        self._by_id[msg_id] = pending
        self._next_tag += 1
        return msg_id

    def pending(self) -> list[str]:
        """The msg_ids published and not yet acked or nacked, oldest first."""
        return [p.msg_id for _, p in sorted(self._pending.items())]

    def _on_return(self, _channel: Any, method: Any, props: Any, _body: bytes) -> None:
        pending = self._by_id.get(getattr(props, "message_id", None) or "")
        if pending is not None:  # its ack follows
            pending.returned = str(method.reply_text)

    def _on_confirm(self, frame: Any) -> None:
        from pika.spec import Basic

        method = frame.method
        tag = int(method.delivery_tag)
        tags = sorted(t for t in self._pending if t <= tag) if method.multiple else [tag]
        done = [self._pending.pop(t) for t in tags if t in self._pending]
        for p in done:
            self._by_id.pop(p.msg_id, None)
        if isinstance(method, Basic.Ack):
            returned = [(p.msg_id, p.returned) for p in done if p.returned is not None]
            try:
                self.ledger.mark_returned(returned)
                self.ledger.confirm([Confirmation(p.msg_id, self.vhost, None, None) for p in done])
            except Exception as e:
                log.error("%d stub(s) not confirmed (they may be resent): %s", len(done), e)
            outcomes = [
                (p.msg_id, Published.CONFIRMED if p.returned is None else Published.UNROUTABLE)
                for p in done
            ]
        else:
            log.warning("%d publish(es) nacked: their stubs stay unconfirmed", len(done))
            outcomes = [(p.msg_id, Published.NACKED) for p in done]
        if self.on_settled is not None:
            for msg_id, what in outcomes:
                self.on_settled(msg_id, what)
