"""A push consumer that hands a queue over instead of dropping it (DeFiBus).

For brokers with the queue access lock on: the new owner of a queue may pull only once the
old owner acked everything it was delivered. So when a rebalance takes a queue away, this
consumer stops pulling it but keeps consuming what it already pulled, and commits the offset
when that is done (the ack the broker waits for); only then is the queue dropped. RocketMQ's
consumer instead drops the queue at once and discards the results of what was in flight,
which the new owner then pulls and consumes again.

It also piggy-backs on a pull only an offset it moved itself (the queue's offset is dirty):
a new owner held back by the lock would otherwise commit, with each refused pull, the old
offset it started from, over the old owner's ack.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from broker_runtime.client.instance import ClientInstance
from broker_runtime.client.model import PullResult
from broker_runtime.client.offset_store import OffsetTable
from broker_runtime.client.process_queue import ProcessQueue
from broker_runtime.client.puller import Puller
from broker_runtime.client.push_consumer import PushConsumer
from broker_runtime.client.rebalance import MessageQueue
from broker_runtime.client.tag_filter import Subscription

log = logging.getLogger(__name__)

POLL_S = 0.05


class OwnCommitsPuller(Puller):
    """Piggy-backs a commit offset only for queues whose offset this consumer changed."""

    def __init__(self, instance: ClientInstance, group: str, table: OffsetTable) -> None:
        super().__init__(instance, group)
        self.table = table

    async def pull(
        self,
        mq: MessageQueue,
        sub: Subscription,
        offset: int,
        max_nums: int,
        commit_offset: int | None = None,
        suspend_ms: int = 0,
        timeout_s: float = 3.0,
    ) -> PullResult:
        if mq not in self.table.dirty:
            commit_offset = None
        return await super().pull(mq, sub, offset, max_nums, commit_offset, suspend_ms, timeout_s)


class HandoverPushConsumer(PushConsumer):
    """`PushConsumer` with handover on rebalance; `handover_timeout_s` caps each handover
    (what is still in flight then is dropped as RocketMQ drops it).

    A queue being handed over is pulled no more, but a pull already waiting at the broker
    (long polling) is let finish and what it brings is consumed too: the broker counts it
    delivered, and the new owner waits for its ack. So a handover lasts at least until that
    pull returns: up to `suspend_ms` when nothing arrives.
    """

    def __init__(self, *args: Any, handover_timeout_s: float = 30.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.handover_timeout_s = handover_timeout_s
        self.puller = OwnCommitsPuller(self.instance, self.group, self.offset_store.table)
        self.handed_over: list[tuple[MessageQueue, int]] = []  # (queue, offset acked at the end)
        self._leaving: dict[ProcessQueue, bool] = {}  # pq -> its pull loop is between pulls
        self._handovers: set[asyncio.Task[None]] = set()

    def _flow_controlled(self, pq: ProcessQueue) -> bool:
        if pq in self._leaving:
            self._leaving[pq] = True  # called before each pull: none is in flight now
            return True
        return super()._flow_controlled(pq)

    async def _drop(self, mq: MessageQueue) -> None:
        pq = self.pq_table.pop(mq)
        puller = self._pull_tasks.pop(mq, None)
        self._leaving[pq] = False
        task = asyncio.get_running_loop().create_task(self._hand_over(mq, pq, puller))
        self._handovers.add(task)
        task.add_done_callback(self._handovers.discard)
        log.info("%s: handing %s over (%d message(s) in flight)", self.client_id, mq, len(pq))

    async def _hand_over(
        self, mq: MessageQueue, pq: ProcessQueue, puller: asyncio.Task[None] | None
    ) -> None:
        deadline = time.monotonic() + self.handover_timeout_s
        try:
            while not (self._leaving[pq] and len(pq) == 0):
                if mq in self.pq_table or not self.running or time.monotonic() > deadline:
                    break  # taken back, stopping, or too slow: drop what is left
                await asyncio.sleep(POLL_S)
            else:
                await self.offset_store.persist(mq)  # the ack the new owner waits for
                self.handed_over.append((mq, self.offset_store.table.get(mq) or -1))
                log.info("%s: handed %s over", self.client_id, mq)
            if mq not in self.pq_table:
                self.offset_store.remove(mq)
        finally:
            pq.dropped = True
            self._leaving.pop(pq, None)
            if puller is not None:
                puller.cancel()
                await asyncio.gather(puller, return_exceptions=True)

    async def _stop_consuming(self, grace_s: float) -> None:
        for task in list(self._handovers):
            task.cancel()
        await asyncio.gather(*self._handovers, return_exceptions=True)
        await super()._stop_consuming(grace_s)
