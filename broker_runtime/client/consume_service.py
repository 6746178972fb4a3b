"""Concurrent consumption (RocketMQ's ConsumeMessageConcurrentlyService).

Pulled messages are handed to the listener in batches of `batch_max` by up to `threads`
workers at once: an async listener runs on the event loop, a plain function in a thread
pool. When a batch is done, its messages leave the process queue and the queue's offset
becomes the lowest one still in flight; it reaches the broker with the next
periodic persist. A failed batch (RECONSUME_LATER, None, an exception) is sent back to the
broker for a later retry; if that fails it is consumed again here after `retry_delay_s`,
and stays in flight meanwhile, holding the offset back.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import cast

from broker_runtime.client.model import ConsumeStatus, MessageModel, ReceivedMessage
from broker_runtime.client.offset_store import OffsetStore
from broker_runtime.client.process_queue import ProcessQueue
from broker_runtime.client.rebalance import MessageQueue

log = logging.getLogger(__name__)


@dataclass
class ConsumeContext:
    """What a listener may read or set about its batch (ConsumeConcurrentlyContext)."""

    mq: MessageQueue
    delay_level_when_next_consume: int = 0  # 0: the broker picks 3 + reconsume times
    ack_index: int = -1  # with CONSUME_SUCCESS: messages after this index failed


Listener = Callable[
    [list[ReceivedMessage], ConsumeContext],
    ConsumeStatus | Awaitable[ConsumeStatus | None] | None,
]
# Hooks run right before and after the listener, where it runs: on a listener thread for a
# plain function, on the event loop for an async one, where an awaitable they return is
# awaited (so a hook can finish its I/O before the batch is acknowledged).
ReceivedHook = Callable[[MessageQueue, list[ReceivedMessage]], object]
OutcomeHook = Callable[[MessageQueue, list[ReceivedMessage], ConsumeStatus], object]
SendBack = Callable[[ReceivedMessage, int], Awaitable[bool]]


class ConsumeService:
    def __init__(
        self,
        listener: Listener,
        model: MessageModel,
        offsets: OffsetStore,
        send_back: SendBack,
        threads: int = 20,
        batch_max: int = 1,
        retry_delay_s: float = 5.0,
        now_ms: Callable[[], int] = lambda: 0,
    ) -> None:
        self.listener = listener
        self.is_async = inspect.iscoroutinefunction(listener)
        self.model = model
        self.offsets = offsets
        self.send_back = send_back
        self.batch_max = batch_max
        self.retry_delay_s = retry_delay_s
        self.now_ms = now_ms
        self.on_received: list[ReceivedHook] = []
        self.on_outcome: list[OutcomeHook] = []
        self._sem = asyncio.Semaphore(threads)
        self._pool = None if self.is_async else ThreadPoolExecutor(threads, "consume")
        self._tasks: set[asyncio.Task[None]] = set()
        self.consumed = 0  # messages whose batch finished with CONSUME_SUCCESS

    def submit(
        self, mq: MessageQueue, pq: ProcessQueue, msgs: list[ReceivedMessage], delay_s: float = 0
    ) -> None:
        loop = asyncio.get_running_loop()
        for i in range(0, len(msgs), self.batch_max):
            task = loop.create_task(self._consume(mq, pq, msgs[i : i + self.batch_max], delay_s))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def shutdown(self, grace_s: float = 0.0) -> None:
        """Wait up to `grace_s` for batches in flight, then cancel the rest (not committed)."""
        if self._tasks and grace_s > 0:
            await asyncio.wait(set(self._tasks), timeout=grace_s)
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    async def _consume(
        self, mq: MessageQueue, pq: ProcessQueue, msgs: list[ReceivedMessage], delay_s: float
    ) -> None:
        if delay_s:
            await asyncio.sleep(delay_s)
        async with self._sem:
            if pq.dropped:  # the queue went to another consumer meanwhile
                return
            ctx = ConsumeContext(mq)
            if self.is_async:
                status = await self._run_async(msgs, ctx)
            else:
                loop = asyncio.get_running_loop()
                status = await loop.run_in_executor(self._pool, self._run_sync, msgs, ctx)
        if not pq.dropped:  # a dropped queue's results are not committed: the new owner redoes
            await self._process_result(status, ctx, mq, pq, msgs)

    def _run_sync(self, msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeStatus:
        for hook in self.on_received:
            hook(ctx.mq, msgs)
        try:
            raw = cast(ConsumeStatus | None, self.listener(msgs, ctx))
            status = ConsumeStatus(raw) if raw is not None else ConsumeStatus.RECONSUME_LATER
        except Exception:
            log.exception("listener failed on %s; the batch will be consumed again", ctx.mq)
            status = ConsumeStatus.RECONSUME_LATER
        for out in self.on_outcome:
            out(ctx.mq, msgs, status)
        return status

    async def _run_async(self, msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeStatus:
        for hook in self.on_received:
            await _settle(hook(ctx.mq, msgs))
        try:
            raw = await self.listener(msgs, ctx)  # type: ignore[misc]
            status = ConsumeStatus(raw) if raw is not None else ConsumeStatus.RECONSUME_LATER
        except Exception:
            log.exception("listener failed on %s; the batch will be consumed again", ctx.mq)
            status = ConsumeStatus.RECONSUME_LATER
        for out in self.on_outcome:
            await _settle(out(ctx.mq, msgs, status))
        return status

    async def _process_result(
        self,
        status: ConsumeStatus,
        ctx: ConsumeContext,
        mq: MessageQueue,
        pq: ProcessQueue,
        msgs: list[ReceivedMessage],
    ) -> None:
        """processConsumeResult: send failures back, move the offset to the lowest in flight."""
        ack = len(msgs) - 1 if status is ConsumeStatus.CONSUME_SUCCESS else -1
        if ctx.ack_index >= 0 and status is ConsumeStatus.CONSUME_SUCCESS:
            ack = min(ack, ctx.ack_index)
        self.consumed += ack + 1
        failed = msgs[ack + 1 :]
        retry_here: list[ReceivedMessage] = []
        if failed and self.model is MessageModel.CLUSTERING:
            for m in failed:
                # Retry/DLQ send-back: the broker stores the message again under
                # %RETRY%{group}; when it cannot, the message is retried here.
                if not await self.send_back(m, ctx.delay_level_when_next_consume):
                    m.msg.reconsume_times += 1
                    retry_here.append(m)
        elif failed:
            log.warning("broadcasting: %d message(s) failed on %s and are dropped", len(failed), mq)
        kept = {id(m) for m in retry_here}
        done = [m.queue_offset for m in msgs if id(m) not in kept]
        offset = pq.remove(done, self.now_ms())
        if offset >= 0 and not pq.dropped:
            self.offsets.update(mq, offset, increase_only=True)
        if retry_here:
            self.submit(mq, pq, retry_here, self.retry_delay_s)


async def _settle(value: object) -> None:
    if inspect.isawaitable(value):
        await value
