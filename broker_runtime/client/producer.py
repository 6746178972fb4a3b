"""The producer (RocketMQ's DefaultMQProducerImpl), on asyncio.

A sync send tries `1 + retry_times` queues, each with the full send timeout: round robin,
leaving out the broker the previous attempt failed on and brokers isolated by recent
failures. A timeout after the broker stored the message makes the retry store it a second
time, with the same UNIQ_KEY: that duplicate is real and the audit
looks for it.

Hooks: `on_before_send(msg)` runs once per message after its UNIQ_KEY is set and before the
first attempt; `on_send_result(msg, result, error)` once when the send is settled (never
for one-way sends). A hook may return an awaitable; it runs on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from broker_runtime.client.api import send_result
from broker_runtime.client.config import ClientConfig
from broker_runtime.client.instance import ClientInstance
from broker_runtime.client.model import MQClientError, SendResult
from broker_runtime.client.msg_id import UniqIdGenerator, default_generator, set_uniq_id
from broker_runtime.client.rebalance import MessageQueue
from broker_runtime.client.route import FaultTable, PublishInfo
from broker_runtime.client.send_attempts import Attempts, attempts, drive, drive_async
from broker_runtime.client.send_hooks import BeforeSend, OnResult, run_after, run_before
from broker_runtime.common.clock import Clock, SystemClock
from broker_runtime.common.java_hash import java_string_hash
from broker_runtime.common.message import (
    DELAY,
    MAX_RECONSUME_TIMES,
    RECONSUME_TIME,
    UNIQ_KEY,
    Message,
    properties_to_string,
)
from broker_runtime.common.topics import is_retry_topic, validate_group, validate_topic
from broker_runtime.remoting.blocking import BlockingPool
from broker_runtime.remoting.bodies import MASTER_ID, HeartbeatData, encode_batch
from broker_runtime.remoting.headers import SendMessageRequestHeader
from broker_runtime.remoting.server import Processor

log = logging.getLogger(__name__)

DEFAULT_GROUP = "DEFAULT_PRODUCER"
MAX_MESSAGE_SIZE = 4 * 1024 * 1024

SendCallback = Callable[[SendResult | None, BaseException | None], object]
QueueSelector = Callable[[Sequence[MessageQueue], Message, object], MessageQueue]
T = TypeVar("T")


class OnLoop(Protocol):
    """Runs a coroutine on the producer's loop and returns its result (LoopThread.run)."""

    def __call__(self, coro: Coroutine[Any, Any, T], /) -> T: ...


def select_by_hash(mqs: Sequence[MessageQueue], msg: Message, key: object) -> MessageQueue:
    """SelectMessageQueueByHash: `abs(key.hashCode() % n)`, with Java's hash codes.

    Stable across processes (Python's own str/bytes hash is salted per process): an int
    is its own hash code, as Integer's; anything else hashes as the string it prints as.
    """
    if isinstance(key, int) and not isinstance(key, bool):
        h = key
    else:
        h = java_string_hash(key if isinstance(key, str) else str(key))
    return mqs[abs(h) % len(mqs)]


class Producer:
    def __init__(
        self,
        config: ClientConfig | str,
        group: str = DEFAULT_GROUP,
        *,
        retry_times: int = 2,
        retry_times_async: int = 2,
        send_timeout_s: float = 3.0,
        max_message_size: int = MAX_MESSAGE_SIZE,
        fault_isolation_ms: int = 30_000,
        default_topic_queue_nums: int = 4,
        id_generator: UniqIdGenerator | None = None,
        clock: Clock | None = None,
        handlers: Mapping[int, Processor] | None = None,
    ) -> None:
        self.config = ClientConfig(config) if isinstance(config, str) else config
        self.group = validate_group(group)
        self.retry_times = retry_times
        self.retry_times_async = retry_times_async
        self.send_timeout_s = send_timeout_s
        self.max_message_size = max_message_size
        self.faults = FaultTable(fault_isolation_ms)
        self.default_topic_queue_nums = default_topic_queue_nums
        self.ids = id_generator or default_generator()
        self.clock = clock or SystemClock()
        self.client_id = self.config.client_id()
        self.on_before_send: list[BeforeSend] = []
        self.on_send_result: list[OnResult] = []
        self.instance = ClientInstance(
            self.config,
            self.client_id,
            self._heartbeat,
            lambda: list(self.instance.publish),
            handlers,  # requests brokers send this producer (a transaction's check)
        )
        self._running = False
        self._pending: set[asyncio.Task[SendResult]] = set()
        self._valid_topics: set[str] = set()
        self._refreshing: set[str] = set()
        self._background: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self.instance.start()
        self._running = True

    async def shutdown(self) -> None:
        if not self._running:
            return
        self._running = False
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.instance.unregister_all(self.group, None)
        await self.instance.close()

    async def __aenter__(self) -> Producer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    def _heartbeat(self) -> HeartbeatData:
        return HeartbeatData(self.client_id, producer_groups=[self.group])

    # -- public sends -----------------------------------------------------------------------
    async def send(self, msg: Message, timeout_s: float | None = None) -> SendResult:
        """Send and wait for the broker's answer; up to `retry_times` retries elsewhere."""
        return await self._settled(msg, 1 + self.retry_times, timeout_s)

    def send_async(
        self, msg: Message, callback: SendCallback | None = None, timeout_s: float | None = None
    ) -> asyncio.Task[SendResult]:
        """Start a send; await the task or pass `callback(result, error)`."""
        self._check_running()
        task = asyncio.get_running_loop().create_task(
            self._settled(msg, 1 + self.retry_times_async, timeout_s)
        )
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        if callback is not None:
            task.add_done_callback(lambda t: _run_callback(callback, t))
        return task

    async def send_oneway(self, msg: Message) -> None:
        """Write the request and return: no answer, no retry, nothing known of the outcome."""
        self._check(msg)
        await run_before(self.on_before_send, [msg])
        info = await self.instance.publish_info(msg.topic, self.default_topic_queue_nums)
        mq = info.select(None, self.faults, self.clock.now_ms())
        addr = await self.instance.master_addr(mq.broker, mq.topic)
        await self.instance.api.send_oneway(addr, self._header(msg, mq), msg.body)

    async def send_batch(
        self, msgs: Sequence[Message], timeout_s: float | None = None
    ) -> SendResult:
        """One SEND_BATCH_MESSAGE: same topic, no delay; message i lands at offset + i."""
        return await self._settled(_batch(msgs), 1 + self.retry_times, timeout_s)

    async def send_orderly(
        self,
        msg: Message,
        sharding_key: object,
        selector: QueueSelector = select_by_hash,
        timeout_s: float | None = None,
    ) -> SendResult:
        """Send to the queue `selector` picks for `sharding_key`: one key, one queue, in order.

        No retry on another queue (that would break the order).
        """
        self._check(msg)
        info = await self.instance.publish_info(msg.topic, self.default_topic_queue_nums)
        mq = selector(info.queues, msg, sharding_key)
        return await self.send_to_queue(msg, mq, timeout_s)

    async def send_to_queue(
        self, msg: Message, mq: MessageQueue, timeout_s: float | None = None
    ) -> SendResult:
        """Send to one given queue, once."""
        self._check(msg)
        if msg.topic != mq.topic:
            raise MQClientError(f"message topic {msg.topic} is not the queue's {mq.topic}")
        await run_before(self.on_before_send, [msg])
        try:
            result = await self._send_kernel([msg], mq, timeout_s or self.send_timeout_s)
        except BaseException as e:
            await run_after(self.on_send_result, [msg], None, e)
            raise
        await run_after(self.on_send_result, [msg], result, None)
        return result

    # -- the send path ----------------------------------------------------------------------
    def _check_running(self) -> None:
        if not self._running:
            raise MQClientError("producer is not started")

    def _check(self, msg: Message) -> None:
        self._check_running()
        if msg.topic not in self._valid_topics:
            self._valid_topics.add(validate_topic(msg.topic))
        if not msg.body:
            raise MQClientError("message body is empty")
        if len(msg.body) > self.max_message_size:
            raise MQClientError(
                f"message body is {len(msg.body)} bytes, max is {self.max_message_size}"
            )
        set_uniq_id(msg, self.ids)

    def _checked(self, msgs: Message | Sequence[Message]) -> list[Message]:
        batch = [msgs] if isinstance(msgs, Message) else list(msgs)
        for m in batch:
            self._check(m)
        if len(batch) > 1 and sum(len(m.body) for m in batch) > self.max_message_size:
            raise MQClientError(f"batch bodies exceed {self.max_message_size} bytes")
        return batch

    async def _settled(
        self, msgs: Message | Sequence[Message], times: int, timeout_s: float | None
    ) -> SendResult:
        batch = self._checked(msgs)
        if self.on_before_send:
            await run_before(self.on_before_send, batch)
        try:
            result = await self._send_with_retries(batch, times, timeout_s or self.send_timeout_s)
        except BaseException as e:
            if self.on_send_result:
                await run_after(self.on_send_result, batch, None, e)
            raise
        if self.on_send_result:
            await run_after(self.on_send_result, batch, result, None)
        return result

    async def _send_with_retries(
        self, msgs: list[Message], times: int, timeout_s: float
    ) -> SendResult:
        info = self.instance.publish.get(msgs[0].topic)  # the hot path: no await when cached
        if info is None or not info.ok():
            info = await self.instance.publish_info(msgs[0].topic, self.default_topic_queue_nums)
        loop = self._attempts(msgs[0].topic, info, times)
        return await drive_async(loop, lambda mq: self._send_kernel(msgs, mq, timeout_s))

    def send_blocking(
        self,
        msgs: Message | Sequence[Message],
        pool: BlockingPool,
        on_loop: OnLoop,
        timeout_s: float | None = None,
    ) -> SendResult:
        """`send` (or `send_batch`, given a list) for a thread that is not the loop's: the
        request goes over `pool`'s blocking sockets, the same attempts and retries as
        `send`. Only route look-ups missing from the cache run on the loop, via `on_loop`.
        SyncProducer's fast path; hooks are not run here (they belong to the loop).
        """
        batch = self._checked(msgs if isinstance(msgs, Message) else _batch(msgs))
        timeout = timeout_s or self.send_timeout_s
        topic = batch[0].topic
        info = self.instance.publish.get(topic)
        if info is None or not info.ok():
            info = on_loop(self.instance.publish_info(topic, self.default_topic_queue_nums))
        api = self.instance.api

        def send(mq: MessageQueue) -> SendResult:
            addr = self.instance.brokers.get(mq.broker, {}).get(MASTER_ID)
            if addr is None:
                addr = on_loop(self.instance.master_addr(mq.broker, mq.topic))
            header, body, ids = self._request(batch, mq)
            return send_result(
                pool.invoke(addr, api.send_request(header, body), timeout), addr, mq, ids
            )

        return drive(self._attempts(topic, info, 1 + self.retry_times), send)

    def _attempts(self, topic: str, info: PublishInfo, times: int) -> Attempts:
        return attempts(topic, info, times, self.faults, self.clock, self._refresh_route_soon)

    def _refresh_route_soon(self, topic: str) -> None:
        """After a failure the route may be stale (a master gone): ask again, in the
        background, once at a time per topic. Callable from any thread."""
        if topic in self._refreshing or self._loop is None:
            return
        self._refreshing.add(topic)
        self._loop.call_soon_threadsafe(self._refresh_route, topic)

    def _refresh_route(self, topic: str) -> None:
        async def refresh() -> None:
            try:
                await self.instance.update_route(topic)
            except Exception as e:
                log.info("route of %s not refreshed after a failure: %s", topic, e)
            finally:
                self._refreshing.discard(topic)

        task = asyncio.get_running_loop().create_task(refresh())
        self._background.add(task)  # the loop keeps only a weak reference
        task.add_done_callback(self._background.discard)

    def _header(
        self, msg: Message, mq: MessageQueue, batch: bool = False
    ) -> SendMessageRequestHeader:
        props = msg.properties
        reconsume, max_reconsume = 0, None
        if is_retry_topic(msg.topic):  # a send-back done by the client travels in the header
            props = dict(props)
            reconsume = int(props.pop(RECONSUME_TIME, 0))
            raw_max = props.pop(MAX_RECONSUME_TIMES, None)
            max_reconsume = int(raw_max) if raw_max is not None else None
        return SendMessageRequestHeader(
            producer_group=self.group,
            topic=msg.topic,
            queue_id=mq.queue_id,
            born_timestamp=self.clock.now_ms(),
            properties="" if batch else properties_to_string(props),
            sys_flag=msg.sys_flag,
            flag=msg.flag,
            reconsume_times=reconsume,
            max_reconsume_times=max_reconsume,
            batch=batch,
            default_topic_queue_nums=self.default_topic_queue_nums,
        )

    async def _send_kernel(
        self, msgs: list[Message], mq: MessageQueue, timeout_s: float
    ) -> SendResult:
        addr = self.instance.brokers.get(mq.broker, {}).get(MASTER_ID)
        if addr is None:
            addr = await self.instance.master_addr(mq.broker, mq.topic)
        header, body, ids = self._request(msgs, mq)
        return await self.instance.api.send(addr, mq, header, body, ids, timeout_s)

    def _request(
        self, msgs: list[Message], mq: MessageQueue
    ) -> tuple[SendMessageRequestHeader, bytes, tuple[str, ...]]:
        """The header, body and UNIQ_KEYs of one attempt at sending `msgs` to `mq`."""
        ids = tuple(m.properties[UNIQ_KEY] for m in msgs)
        if len(msgs) == 1:
            return self._header(msgs[0], mq), msgs[0].body, ids
        body = encode_batch([(m.body, m.properties, m.flag) for m in msgs])
        return self._header(msgs[0], mq, batch=True), body, ids


def _batch(msgs: Sequence[Message]) -> Sequence[Message]:
    """`msgs` if they can go as one batch: same topic, no delay."""
    if not msgs:
        raise MQClientError("empty batch")
    topic = msgs[0].topic
    for m in msgs:
        if m.topic != topic:
            raise MQClientError("every message of a batch must have the same topic")
        if DELAY in m.properties:
            raise MQClientError("a batch cannot carry delayed messages")
    return msgs


def _run_callback(callback: SendCallback, task: asyncio.Task[SendResult]) -> None:
    if task.cancelled():
        callback(None, asyncio.CancelledError())
    elif task.exception() is not None:
        callback(None, task.exception())
    else:
        callback(task.result(), None)
