"""Orderly consumption (RocketMQ's ConsumeMessageOrderlyService): one queue, one consumer,
its messages one after another in queue order.

A queue is pulled only while this consumer holds its broker-side lock (LOCK_BATCH_MQ on the
queue's master), taken when the rebalance gives it the queue and renewed every
`lock_interval_s` (the broker lets a lock go after 60 s without renewal; this side stops
consuming once its last renewal is older than `lock_expiry_s`). A failed message
(RECONSUME_LATER, None or an exception) is not sent back: its queue is suspended for
`suspend_ms` and the same message is consumed again, in place, so nothing after it runs
first. Past `max_reconsume_times` (-1: never, RocketMQ's default) it is sent to the group's
retry topic with its reconsume count, where the broker dead-letters it, and the queue moves
on. The offset committed is the one after the last message consumed. Giving a queue up
waits for the message being consumed, commits, then unlocks it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import cast

from broker_runtime.client.config import ClientConfig
from broker_runtime.client.consume_service import (
    ConsumeContext,
    Listener,
    OutcomeHook,
    ReceivedHook,
)
from broker_runtime.client.consumer_base import ConsumerBase
from broker_runtime.client.consumer_options import ConsumerOptions
from broker_runtime.client.model import ConsumeStatus, ReceivedMessage
from broker_runtime.client.process_queue import ProcessQueue
from broker_runtime.client.rebalance import MessageQueue
from broker_runtime.client.retry import ConsumeRetry, restore_retry_topic
from broker_runtime.remoting.bodies import LockBatchRequestBody, decode_lock_ok
from broker_runtime.remoting.command import request
from broker_runtime.remoting.protocol import RequestCode

log = logging.getLogger(__name__)

LOCK_RETRY_S = 1.0  # a queue whose lock was refused is tried again this often


class _Queue:
    """What the consumer knows of one queue it owns."""

    def __init__(self) -> None:
        self.locked_at: float | None = None  # monotonic time of the last granted lock
        self.arrived = asyncio.Event()
        self.consuming = asyncio.Lock()  # held while a message of the queue is consumed
        self.task: asyncio.Task[None] | None = None


class OrderlyPushConsumer(ConsumerBase):
    consume_type = "CONSUME_PASSIVELY"

    def __init__(
        self,
        config: ClientConfig | str,
        group: str,
        listener: Listener,
        options: ConsumerOptions | None = None,
        *,
        suspend_ms: int = 1000,
        max_reconsume_times: int = -1,
        batch_max: int = 1,
        threads: int = 20,
        lock_interval_s: float = 20.0,
        lock_expiry_s: float = 30.0,
        pull_threshold_for_queue: int = 1000,
    ) -> None:
        super().__init__(config, group, options)
        if suspend_ms < 0 or batch_max < 1:
            raise ValueError("suspend_ms must be >= 0 and batch_max >= 1")
        self.listener = listener
        self.suspend_ms = suspend_ms
        self.max_reconsume_times = max_reconsume_times
        self.batch_max = batch_max
        self.lock_interval_s = lock_interval_s
        self.lock_expiry_s = lock_expiry_s
        self.pull_threshold_for_queue = pull_threshold_for_queue
        self.on_received: list[ReceivedHook] = []
        self.on_outcome: list[OutcomeHook] = []
        self.consumed = 0
        self.suspended = 0  # times a queue was suspended after a failure
        self._queues: dict[MessageQueue, _Queue] = {}
        self._pool = ThreadPoolExecutor(threads, "orderly")
        self._dlq = ConsumeRetry(
            self.instance, self.config, self.group, max(max_reconsume_times, 0), self.rebalance_now
        )

    async def start(self) -> None:
        await super().start()
        self.instance.every(self.lock_interval_s, self.lock_all)

    async def _stop_consuming(self, grace_s: float) -> None:
        await super()._stop_consuming(grace_s)
        tasks = [q.task for q in self._queues.values() if q.task is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.persist_offsets()  # commit, then unlock: the next owner starts from there
        await self._unlock(list(self._queues))
        self._queues.clear()
        await self._dlq.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- locks --------------------------------------------------------------------------------
    async def _lock(self, mqs: list[MessageQueue]) -> set[MessageQueue]:
        """LOCK_BATCH_MQ per broker; the queues now held (taken or renewed)."""
        held: set[MessageQueue] = set()
        by_broker: dict[str, list[MessageQueue]] = {}
        for mq in mqs:
            by_broker.setdefault(mq.broker, []).append(mq)
        for broker, group in by_broker.items():
            body = LockBatchRequestBody(
                self.group, self.client_id, [(m.topic, m.broker, m.queue_id) for m in group]
            ).encode()
            try:
                addr = await self.instance.master_addr(broker, group[0].topic)
                resp = await self.instance.api.invoke(
                    addr, request(RequestCode.LOCK_BATCH_MQ, body=body)
                )
                self.instance.api.check(resp, addr)
                held |= {MessageQueue(t, b, q) for t, b, q in decode_lock_ok(resp.body)}
            except Exception as e:
                log.warning("%s: lock of %d queue(s) on %s failed: %s", self.client_id,
                            len(group), broker, e)  # fmt: skip
        return held

    async def _unlock(self, mqs: Iterable[MessageQueue]) -> None:
        by_broker: dict[str, list[MessageQueue]] = {}
        for mq in mqs:
            by_broker.setdefault(mq.broker, []).append(mq)
        for broker, group in by_broker.items():
            body = LockBatchRequestBody(
                self.group, self.client_id, [(m.topic, m.broker, m.queue_id) for m in group]
            ).encode()
            try:
                addr = await self.instance.master_addr(broker, group[0].topic)
                cmd = request(RequestCode.UNLOCK_BATCH_MQ, body=body)
                self.instance.api.check(await self.instance.api.invoke(addr, cmd), addr)
            except Exception as e:  # the broker lets it expire
                log.info("%s: unlock on %s failed: %s", self.client_id, broker, e)

    async def lock_all(self) -> None:
        """Renew the locks of every owned queue (RebalanceImpl.lockAll)."""
        owned = list(self._queues)
        held = await self._lock(owned)
        now = time.monotonic()
        for mq in owned:
            q = self._queues.get(mq)
            if q is None:
                continue
            if mq in held:
                was = self.is_locked(mq)
                q.locked_at = now
                if not was:
                    q.arrived.set()
            elif q.locked_at is not None:
                log.warning("%s: lost the lock of %s", self.client_id, mq)
                q.locked_at = None

    def is_locked(self, mq: MessageQueue) -> bool:
        q = self._queues.get(mq)
        return (
            q is not None
            and q.locked_at is not None
            and time.monotonic() - q.locked_at < self.lock_expiry_s
        )

    # -- queues -------------------------------------------------------------------------------
    def _queue_added(self, mq: MessageQueue, pq: ProcessQueue, offset: int) -> None:
        q = self._queues[mq] = _Queue()
        q.task = asyncio.get_running_loop().create_task(self._take(mq, pq, q))

    async def _take(self, mq: MessageQueue, pq: ProcessQueue, q: _Queue) -> None:
        """Lock the queue (retrying), read its committed offset then, pull and consume it."""
        while mq not in await self._lock([mq]):
            if pq.dropped:
                return
            await asyncio.sleep(LOCK_RETRY_S)
        q.locked_at = time.monotonic()
        # The previous owner committed before it unlocked: start from what it committed.
        offset = await self.compute_pull_from(mq)
        self.offset_store.update(mq, offset)
        self._pull_tasks[mq] = asyncio.get_running_loop().create_task(
            self._pull_loop(mq, pq, offset)
        )
        await self._consume_loop(mq, pq, q)

    async def _drop(self, mq: MessageQueue) -> None:
        q = self._queues.pop(mq, None)
        pq = self.pq_table.get(mq)
        if pq is not None:
            pq.dropped = True
        if q is not None:
            async with q.consuming:  # let the message being consumed finish and commit
                pass
            if q.task is not None:
                q.task.cancel()
        await super()._drop(mq)
        await self._unlock([mq])

    def _flow_controlled(self, pq: ProcessQueue) -> bool:
        return len(pq) > self.pull_threshold_for_queue

    def _deliver(self, mq: MessageQueue, pq: ProcessQueue, msgs: list[ReceivedMessage]) -> None:
        q = self._queues.get(mq)
        if q is not None:
            q.arrived.set()

    # -- consuming ----------------------------------------------------------------------------
    async def _consume_loop(self, mq: MessageQueue, pq: ProcessQueue, q: _Queue) -> None:
        while self.running and not pq.dropped:
            batch = cast(list[ReceivedMessage], pq.messages()[: self.batch_max])
            if not batch or not self.is_locked(mq):
                q.arrived.clear()
                try:
                    await asyncio.wait_for(q.arrived.wait(), 1.0)
                except TimeoutError:
                    pass
                continue
            async with q.consuming:
                if pq.dropped:
                    return
                status = await self._consume(mq, batch)
                if status is ConsumeStatus.CONSUME_SUCCESS or await self._give_up(batch):
                    self.consumed += len(batch)
                    offset = pq.remove([m.queue_offset for m in batch], self.clock.now_ms())
                    if offset >= 0:
                        self.offset_store.update(mq, offset, increase_only=True)
                    continue
            self.suspended += 1
            for m in batch:
                m.msg.reconsume_times += 1
            await asyncio.sleep(self.suspend_ms / 1000)

    async def _consume(self, mq: MessageQueue, msgs: list[ReceivedMessage]) -> ConsumeStatus:
        restore_retry_topic(self.group, msgs)
        for hook in self.on_received:
            await _settle(hook(mq, msgs))
        ctx = ConsumeContext(mq)
        try:
            if inspect.iscoroutinefunction(self.listener):
                raw = await self.listener(msgs, ctx)
            else:
                loop = asyncio.get_running_loop()
                raw = await loop.run_in_executor(self._pool, self.listener, msgs, ctx)
            status = ConsumeStatus(raw) if raw is not None else ConsumeStatus.RECONSUME_LATER
        except Exception:
            log.exception("orderly listener failed on %s; the queue is suspended", mq)
            status = ConsumeStatus.RECONSUME_LATER
        for out in self.on_outcome:
            await _settle(out(mq, msgs, status))
        return status

    async def _give_up(self, msgs: list[ReceivedMessage]) -> bool:
        """Past max reconsume times: to the DLQ by way of the retry topic; True if all went."""
        if self.max_reconsume_times < 0:
            return False
        if any(m.reconsume_times < self.max_reconsume_times for m in msgs):
            return False
        for m in msgs:
            try:
                await self._dlq.send_to_retry_topic(m, 0)
            except Exception as e:
                log.warning("%s: %s not sent to the DLQ (%s): suspended again",
                            self.client_id, m.msg_id, e)  # fmt: skip
                return False
        return True


async def _settle(value: object) -> None:
    if inspect.isawaitable(value):
        await value
