"""Blocking facades over the asyncio clients, for scripts, CLIs and Airflow tasks.

Each facade runs its own event loop in a daemon thread; a call blocks the caller until the
coroutine finishes there. Hooks added to the wrapped client run on that loop thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from broker_runtime.client.lite_pull_consumer import LitePullConsumer
from broker_runtime.client.model import ReceivedMessage, SendResult
from broker_runtime.client.producer import Producer, QueueSelector, select_by_hash
from broker_runtime.client.rebalance import MessageQueue
from broker_runtime.common import aio
from broker_runtime.common.message import Message
from broker_runtime.remoting.blocking import BlockingPool

T = TypeVar("T")


class LoopThread:
    """An event loop running in a daemon thread until `stop`."""

    def __init__(self, name: str = "mq-client") -> None:
        self.loop = aio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        return self.submit(coro).result(timeout_s)

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class SyncProducer:
    """`Producer` with blocking calls; `send_async` returns a concurrent Future.

    `send` and `send_batch` write to the broker from the calling thread over blocking
    sockets (one pool, shared by threads) unless the producer has hooks, which run on its
    loop; route look-ups, heartbeats and the other calls go through the loop thread.
    """

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self._loop = LoopThread("mq-producer")
        self._pool = BlockingPool()

    def start(self) -> SyncProducer:
        self._loop.run(self.producer.start())
        return self

    def shutdown(self) -> None:
        try:
            self._pool.close()
            self._loop.run(self.producer.shutdown())
        finally:
            self._loop.stop()

    def __enter__(self) -> SyncProducer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def send(self, msg: Message, timeout_s: float | None = None) -> SendResult:
        if self._hooked():
            return self._loop.run(self.producer.send(msg, timeout_s))
        return self.producer.send_blocking(msg, self._pool, self._loop.run, timeout_s)

    def send_async(self, msg: Message) -> concurrent.futures.Future[SendResult]:
        return self._loop.submit(self.producer.send(msg, None))

    def send_oneway(self, msg: Message) -> None:
        self._loop.run(self.producer.send_oneway(msg))

    def send_batch(self, msgs: Sequence[Message], timeout_s: float | None = None) -> SendResult:
        if self._hooked():
            return self._loop.run(self.producer.send_batch(msgs, timeout_s))
        return self.producer.send_blocking(list(msgs), self._pool, self._loop.run, timeout_s)

    def _hooked(self) -> bool:
        return bool(self.producer.on_before_send or self.producer.on_send_result)

    def send_orderly(
        self, msg: Message, sharding_key: object, selector: QueueSelector = select_by_hash
    ) -> SendResult:
        return self._loop.run(self.producer.send_orderly(msg, sharding_key, selector))

    def send_to_queue(self, msg: Message, mq: MessageQueue) -> SendResult:
        return self._loop.run(self.producer.send_to_queue(msg, mq))


class SyncLitePullConsumer:
    """`LitePullConsumer` with blocking calls."""

    def __init__(self, consumer: LitePullConsumer) -> None:
        self.consumer = consumer
        self._loop = LoopThread("mq-consumer")

    def start(self) -> SyncLitePullConsumer:
        self._loop.run(self.consumer.start())
        return self

    def shutdown(self) -> None:
        try:
            self._loop.run(self.consumer.shutdown())
        finally:
            self._loop.stop()

    def __enter__(self) -> SyncLitePullConsumer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def subscribe(self, topic: str, expression: str = "*") -> None:
        async def on_loop() -> None:  # the consumer's state belongs to its loop thread
            self.consumer.subscribe(topic, expression)

        self._loop.run(on_loop())

    def assign(self, mqs: Iterable[MessageQueue]) -> None:
        self._loop.run(self.consumer.assign(list(mqs)))

    def fetch_message_queues(self, topic: str) -> list[MessageQueue]:
        return self._loop.run(self.consumer.fetch_message_queues(topic))

    def poll(self, timeout_s: float = 5.0) -> list[ReceivedMessage]:
        return self._loop.run(self.consumer.poll(timeout_s))

    def seek(self, mq: MessageQueue, offset: int) -> None:
        self._loop.run(self.consumer.seek(mq, offset))

    def commit(self, offsets: Mapping[MessageQueue, int] | None = None) -> None:
        self._loop.run(self.consumer.commit(offsets))

    def committed(self, mq: MessageQueue) -> int:
        return self._loop.run(self.consumer.committed(mq))
