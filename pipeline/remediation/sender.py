"""The broker side of remediation: sends through the product's producer client, lookups
through its admin client, and pacing."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from broker_runtime.client.admin import MQAdmin
from broker_runtime.client.config import ClientConfig
from broker_runtime.client.model import MQClientError, ReceivedMessage, SendResult
from broker_runtime.client.producer import Producer
from broker_runtime.client.sync import LoopThread, SyncProducer
from broker_runtime.common.message import Message
from broker_runtime.remoting.connection import RemotingError

DEFAULT_GROUP = "mqaudit-remediation"

Stored = tuple[str, int | None, int | None]  # broker (a RabbitMQ virtual host), queue id, offset


@dataclass(frozen=True)
class BrokerTarget:
    """Where the cluster is and how to sign in (from the CLI or Airflow settings)."""

    namesrv: str
    access_key: str | None = None
    secret_key: str | None = None

    def config(self) -> ClientConfig:
        return ClientConfig(self.namesrv, access_key=self.access_key, secret_key=self.secret_key)


class BrokerClient:
    """A started producer and an admin client for one job; use as a context manager.

    `retry_times` 0 sends each message once: a retry after a lost answer would store it a
    second time, which a replay must not do; it logs the send as of unknown outcome instead.
    """

    def __init__(
        self,
        target: BrokerTarget,
        *,
        group: str = DEFAULT_GROUP,
        retry_times: int = 2,
        send_timeout_s: float = 5.0,
    ) -> None:
        self.target = target
        self.producer = SyncProducer(
            Producer(target.config(), group, retry_times=retry_times, send_timeout_s=send_timeout_s)
        )
        self._admin_loop: LoopThread | None = None
        self._admin: MQAdmin | None = None

    def __enter__(self) -> BrokerClient:
        self.producer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.producer.shutdown()
        finally:
            if self._admin_loop is not None:
                admin = self._admin
                if admin is not None:
                    self._admin_loop.run(admin.__aexit__(None, None, None))
                self._admin_loop.stop()

    # What `reconcile` logs for an in-doubt send the brokers' key index does not hold.
    not_found = "not stored (checked after an interrupted run)"

    def send(self, msg: Message) -> SendResult:
        return self.producer.send(msg)

    def deliver(self, msg: Message) -> tuple[str, Stored]:
        """Send once (`send`); (where it went, in words; where the broker stored it)."""
        result = self.send(msg)
        where = f"stored on {result.mq.broker} queue {result.mq.queue_id} ({result.status.value})"
        return where, (result.mq.broker, result.mq.queue_id, result.queue_offset)

    def locate(
        self, topic: str, msg_id: str, run_id: str, run_property: str
    ) -> tuple[str, Stored] | None:
        """Where a send of run `run_id` (its `run_property`) of `msg_id` was stored, if it was."""
        found = self.find(topic, msg_id, lambda m: m.properties.get(run_property) == run_id)
        if found is None:
            return None
        where = f"found on {found.broker} queue {found.queue_id} after an interrupted run"
        return where, (found.broker, found.queue_id, found.queue_offset)

    def find(
        self, topic: str, msg_id: str, match: Callable[[ReceivedMessage], bool]
    ) -> ReceivedMessage | None:
        """The first message of `topic` with UNIQ_KEY `msg_id` that `match` accepts, by the
        brokers' key index; None if there is none. Raises MQClientError if unanswerable."""
        if self._admin_loop is None:
            self._admin_loop = LoopThread("mq-remediation-admin")

        async def query() -> list[ReceivedMessage]:
            if self._admin is None:  # made on its loop, kept for the job's lookups
                self._admin = MQAdmin(self.target.config())
            return await self._admin.query_by_key(topic, msg_id)

        try:
            found = self._admin_loop.run(query())
        except RemotingError as e:
            raise MQClientError(f"cannot look up {msg_id} in {topic}: {e}") from e
        return next((m for m in found if m.msg_id == msg_id and match(m)), None)


class Pacer:
    """At most `rate` calls of `wait()` per second (sleeps until the next slot)."""

    def __init__(
        self,
        rate: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be positive, got {rate}")
        self.interval = 1.0 / rate
        self.clock = clock
        self.sleep = sleep
        self._next: float | None = None

    def wait(self) -> None:
        now = self.clock()
        if self._next is not None and now < self._next:
            self.sleep(self._next - now)
            now = self._next
        self._next = now + self.interval
