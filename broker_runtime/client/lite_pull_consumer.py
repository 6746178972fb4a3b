"""The pull consumer (RocketMQ's DefaultLitePullConsumer): subscribe (queues by rebalance)
or assign (queues by hand), then poll and commit.

Pull loops fill a buffer in the background; `poll` hands out one pulled batch at a time and
moves the queue's *consumed* offset past it. `commit` sends the consumed offsets to the
offset store; with `auto_commit`, `poll` does so every `auto_commit_interval_s`, so a batch
is committed by a later poll: process a batch before polling again and nothing is lost.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping

from broker_runtime.client.config import ClientConfig
from broker_runtime.client.consume_service import ReceivedHook
from broker_runtime.client.consumer_base import ConsumerBase
from broker_runtime.client.consumer_options import ConsumerOptions
from broker_runtime.client.model import (
    MQClientError,
    ReceivedMessage,
)
from broker_runtime.client.offset_store import ReadType
from broker_runtime.client.process_queue import ProcessQueue
from broker_runtime.client.rebalance import MessageQueue
from broker_runtime.client.route import read_queues
from broker_runtime.client.tag_filter import Subscription, parse

_Request = tuple[MessageQueue, ProcessQueue, list[ReceivedMessage]]


class LitePullConsumer(ConsumerBase):
    consume_type = "CONSUME_ACTIVELY"
    # As DefaultLitePullConsumer: offsets reach the broker by commit only. A pull carrying
    # the last commit, sent as `poll` handed a batch out, could reach the broker after the
    # next commit and set the group's offset back (the broker stores what it is told).
    commit_on_pull = False

    def __init__(
        self,
        config: ClientConfig | str,
        group: str,
        options: ConsumerOptions | None = None,
        *,
        auto_commit: bool = True,
        auto_commit_interval_s: float = 5.0,
        pull_threshold_for_all: int = 10_000,
        pull_threshold_for_queue: int = 1000,
    ) -> None:
        super().__init__(config, group, options)
        self.auto_commit = auto_commit
        self.auto_commit_interval_s = auto_commit_interval_s
        self.pull_threshold_for_all = pull_threshold_for_all
        self.pull_threshold_for_queue = pull_threshold_for_queue
        self.consumed_offsets: dict[MessageQueue, int] = {}  # past what poll handed out
        self._assigned: set[MessageQueue] | None = None  # set by assign(): no rebalance
        self._buffer: asyncio.Queue[_Request] | None = None
        self._buffered = 0
        self._next_commit = 0.0
        self.on_received: list[ReceivedHook] = []  # (mq, msgs) as poll hands them out

    # -- assignment -------------------------------------------------------------------------
    def subscribe(self, topic: str, expression: str = "*", expression_type: str = "TAG") -> None:
        if self._assigned is not None:
            raise MQClientError("assign() and subscribe() cannot be mixed")
        super().subscribe(topic, expression, expression_type)

    async def assign(self, mqs: Iterable[MessageQueue]) -> None:
        """Own exactly `mqs` (no rebalance); each starts at its committed offset."""
        if self.subscriptions:
            raise MQClientError("assign() and subscribe() cannot be mixed")
        wanted = set(mqs)
        self._assigned = wanted
        for topic in {mq.topic for mq in wanted}:
            if topic not in self.instance.routes:
                await self.instance.update_route(topic)
        if self.running:
            await self._apply_assignment()

    async def fetch_message_queues(self, topic: str) -> list[MessageQueue]:
        """Every readable queue of `topic`, from the name servers."""
        route = await self.instance.update_route(topic)
        if route is None:
            raise MQClientError(f"topic {topic!r} has no route")
        return read_queues(topic, route)

    async def rebalance(self) -> None:
        if self._assigned is None:
            await super().rebalance()
        else:
            await self._apply_assignment()

    async def _apply_assignment(self) -> None:
        assert self._assigned is not None and self._rebalance_lock is not None
        async with self._rebalance_lock:
            for topic in {mq.topic for mq in self._assigned} | {mq.topic for mq in self.pq_table}:
                await self._update_queues(topic, {mq for mq in self._assigned if mq.topic == topic})

    def _subscription(self, topic: str) -> Subscription | None:
        sub = self.subscriptions.get(topic)
        if sub is None and self._assigned is not None:
            return parse(topic, "*")
        return sub

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        self._buffer = asyncio.Queue()
        self._next_commit = time.monotonic() + self.auto_commit_interval_s
        await super().start()

    async def shutdown(self, grace_s: float = 0.0) -> None:
        if self.running and self.auto_commit:
            await self.commit()
        await super().shutdown(grace_s)

    # -- pulling and polling ----------------------------------------------------------------
    def _flow_controlled(self, pq: ProcessQueue) -> bool:
        return (
            self._buffered > self.pull_threshold_for_all or len(pq) > self.pull_threshold_for_queue
        )

    def _queue_added(self, mq: MessageQueue, pq: ProcessQueue, offset: int) -> None:
        self.consumed_offsets[mq] = offset
        super()._queue_added(mq, pq, offset)

    async def _drop(self, mq: MessageQueue) -> None:
        if self.auto_commit and mq in self.consumed_offsets:  # hand over what was polled
            self.offset_store.update(mq, self.consumed_offsets[mq])
        await super()._drop(mq)

    def _queue_removed(self, mq: MessageQueue, pq: ProcessQueue) -> None:
        self.consumed_offsets.pop(mq, None)
        super()._queue_removed(mq, pq)

    def _deliver(self, mq: MessageQueue, pq: ProcessQueue, msgs: list[ReceivedMessage]) -> None:
        assert self._buffer is not None
        self._buffered += len(msgs)
        self._buffer.put_nowait((mq, pq, msgs))

    async def poll(self, timeout_s: float = 5.0) -> list[ReceivedMessage]:
        """The next pulled batch, or [] when none arrives within `timeout_s`."""
        if not self.running or self._buffer is None:
            raise MQClientError("consumer is not started")
        if self.auto_commit and time.monotonic() >= self._next_commit:
            await self.commit()
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            try:
                mq, pq, msgs = await asyncio.wait_for(self._buffer.get(), max(remaining, 0))
            except TimeoutError:
                return []
            self._buffered -= len(msgs)
            if pq.dropped:  # seeked, or the queue went to another consumer
                continue
            offset = pq.remove([m.queue_offset for m in msgs], self.clock.now_ms())
            if offset >= 0:
                self.consumed_offsets[mq] = offset
            for hook in self.on_received:
                hook(mq, msgs)
            return msgs

    async def seek(self, mq: MessageQueue, offset: int) -> None:
        """Read `mq` from `offset` next (within [min offset, max offset])."""
        if mq not in self.pq_table:
            raise MQClientError(f"{mq} is not assigned to this consumer")
        low, high = await self.min_offset(mq), await self.max_offset(mq)
        if not low <= offset <= high:
            raise MQClientError(f"offset {offset} of {mq} is outside [{low}, {high}]")
        old = self.pq_table[mq]
        old.dropped = True
        self._queue_removed(mq, old)
        pq = ProcessQueue(self.clock.now_ms())
        self.pq_table[mq] = pq
        self._queue_added(mq, pq, offset)

    async def seek_to_begin(self, mq: MessageQueue) -> None:
        await self.seek(mq, await self.min_offset(mq))

    async def seek_to_end(self, mq: MessageQueue) -> None:
        await self.seek(mq, await self.max_offset(mq))

    # -- offsets ----------------------------------------------------------------------------
    async def commit(self, offsets: Mapping[MessageQueue, int] | None = None) -> None:
        """Store `offsets` (default: what poll has handed out) and send them now."""
        chosen = dict(self.consumed_offsets if offsets is None else offsets)
        for mq, off in chosen.items():
            self.offset_store.update(mq, off)
        await self.offset_store.persist_all(list(chosen))
        self._next_commit = time.monotonic() + self.auto_commit_interval_s

    async def committed(self, mq: MessageQueue) -> int:
        """The offset stored for the group (-1: none)."""
        return await self.offset_store.read(mq, ReadType.STORE)
