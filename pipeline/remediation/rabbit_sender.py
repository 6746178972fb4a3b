"""The RabbitMQ side of remediation: publishes with confirms, as `BrokerClient` sends to the
cluster, for the shared send loop (`pipeline.remediation.sends`) and the resend job.

Each publish is `mandatory` on a channel in confirm mode, with the message's own
`message_id` and the run's id in a header: acked -> sent; returned unrouted -> refused
(NO_ROUTE: stored in no queue); nacked, or the channel closed by the broker (no such
exchange) -> refused; a lost connection -> unknown outcome (the next publish connects again).

Reconciling after an interrupted run. A RocketMQ send of unknown outcome is looked up in the
brokers' key index. A RabbitMQ queue cannot be searched: reading a message takes it from its
consumers (or, with a requeue, marks it redelivered and moves it), and it may already have been
consumed. So `locate` finds nothing and an in-doubt send is logged `failed` with
`not_found`, which says so: a resumed run (or the next one) publishes it again. That is
at-least-once, bounded by what the outcome log had not flushed when the run died (at most its
buffer of rows, `OutcomeLog.every_rows`, plus the publish in flight); the copy carries the
same `message_id`, so an idempotent consumer (`IdempotentCallback`) runs its effect once and
the audit shows a second delivery as `delivered_twice` (`producer_resend`). The other choice,
never publishing an in-doubt message again, would silently keep dead letters from their
queues; `force` is not needed to resend such a message because no send of it is known.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from broker_runtime.client.model import MQBrokerError, MQClientError
from broker_runtime.common.message import REPLAY_ID_PROPERTY, REPLAY_OF_PROPERTY
from broker_runtime.ledger.engine import open_ledger
from broker_runtime.ledger.producer import ProducerLedger
from pipeline.readers.layout import ledger_sources
from pipeline.remediation.sender import Stored

NO_ROUTE = 312  # AMQP reply code of a returned mandatory publish
NACKED = 0


@dataclass(frozen=True)
class RabbitMessage:
    """One publish: where to, the body, its `message_id` and headers (`CC` for extra keys)."""

    exchange: str
    routing_key: str
    body: bytes
    msg_id: str
    headers: dict[str, Any] = field(default_factory=dict)


def headers_of(stored: str | None) -> dict[str, Any]:
    """A stub's `headers` JSON (None: none) as publish headers."""
    if not stored:
        return {}
    value = json.loads(stored)
    if not isinstance(value, dict):
        raise ValueError(f"a stub's headers must be a JSON object, got {stored[:80]!r}")
    return value


def dead_letter_message(
    msg_id: str, body: bytes, death: str, headers: str | None, replay_id: str, dlq_msg_id: str
) -> RabbitMessage:
    """The publish of a dead letter: to the exchange and routing keys of its newest death
    (`x-death`, newest first), with the stub's headers and the replay's own."""
    newest = json.loads(death)[0]
    keys = [str(k) for k in newest.get("routing-keys") or []]
    out = headers_of(headers)
    if len(keys) > 1 and "CC" not in out:
        out["CC"] = keys[1:]
    out[REPLAY_ID_PROPERTY] = replay_id
    out[REPLAY_OF_PROPERTY] = dlq_msg_id
    return RabbitMessage(str(newest["exchange"]), keys[0] if keys else "", body, msg_id, out)


@dataclass(frozen=True)
class RabbitTarget:
    """Where a RabbitMQ replay or resend publishes (an AMQP URL naming the virtual host) and
    where the producer's kept bodies are (its ledger: `data_dir`/ledger or `ledger_url`)."""

    url: str
    data_dir: str | None = None
    ledger_url: str | None = None

    def producer_ledger(self) -> ProducerLedger | None:
        from pathlib import Path

        source = ledger_sources(
            Path(self.data_dir) if self.data_dir else None, self.ledger_url
        ).message_stub
        return None if source is None else ProducerLedger(open_ledger(None, "producer", source))


class RabbitClient:
    """A confirm-mode channel on one RabbitMQ virtual host; use as a context manager."""

    not_found = (
        "not checkable: a RabbitMQ queue cannot be searched without consuming it, so a "
        "publish of an interrupted run may or may not have been confirmed (sent again, "
        "same message_id)"
    )

    def __init__(self, url: str, *, timeout_s: float = 10.0) -> None:
        import pika

        self.params = pika.URLParameters(url)
        self.params.blocked_connection_timeout = timeout_s
        self.params.socket_timeout = timeout_s
        self.vhost = str(self.params.virtual_host)
        self._conn: Any = None
        self._channel: Any = None

    def __enter__(self) -> RabbitClient:
        self._connect()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._close()

    def _connect(self) -> Any:
        import pika
        from pika.exceptions import AMQPError

        if self._channel is None or not self._channel.is_open:
            self._close()
            try:
                self._conn = pika.BlockingConnection(self.params)
                self._channel = self._conn.channel()
                self._channel.confirm_delivery()
            except AMQPError as e:
                self._close()
                raise MQClientError(f"cannot reach RabbitMQ vhost {self.vhost!r}: {e!r}") from e
        return self._channel

    def _close(self) -> None:
        conn, self._conn, self._channel = self._conn, None, None
        if conn is not None and conn.is_open:
            try:
                conn.close()
            except Exception:  # already gone: nothing to close
                pass

    def deliver(self, msg: RabbitMessage) -> tuple[str, Stored]:
        """Publish `msg` (mandatory) and wait for the broker's confirm."""
        import pika
        from pika.exceptions import AMQPError, ChannelClosedByBroker, NackError, UnroutableError

        channel = self._connect()
        props = pika.BasicProperties(
            message_id=msg.msg_id, headers=msg.headers or None, delivery_mode=2
        )
        try:
            channel.basic_publish(msg.exchange, msg.routing_key, msg.body, props, mandatory=True)
        except UnroutableError as e:
            text = e.messages[0].method.reply_text if e.messages else "NO_ROUTE"
            raise MQBrokerError(NO_ROUTE, f"returned unrouted ({text})", self.vhost) from e
        except NackError as e:
            raise MQBrokerError(NACKED, "nacked the publish", self.vhost) from e
        except ChannelClosedByBroker as e:  # e.g. 404: no such exchange; nothing was stored
            self._close()
            raise MQBrokerError(e.reply_code, e.reply_text, self.vhost) from e
        except AMQPError as e:
            self._close()
            raise MQClientError(f"publish to vhost {self.vhost!r} lost: {e!r}") from e
        key = f", key '{msg.routing_key}'" if msg.routing_key else ""
        where = f"confirmed by vhost {self.vhost} (exchange '{msg.exchange}'{key})"
        return where, (self.vhost, None, None)

    def locate(
        self, topic: str, msg_id: str, run_id: str, run_property: str
    ) -> tuple[str, Stored] | None:
        """Nothing: a queue cannot be searched without consuming (see the module)."""
        return None
