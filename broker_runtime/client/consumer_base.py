"""What push and pull consumers share: subscriptions, the offset store, heartbeats, and the
rebalance (RocketMQ's RebalanceImpl) that decides which queues this consumer owns.

Rebalance runs every `rebalance_interval_s`, at start, and when a broker sends
NOTIFY_CONSUMER_IDS_CHANGED. Per topic: the readable queues from the route, the group's
members from one broker, then the allocation strategy (`allocate`, AVG by default) on that
view. A queue given up is marked dropped, its offset persisted; a queue taken starts at the
group's committed offset, or where `consume_from` says when there is none.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Self

from broker_runtime.client.config import ClientConfig
from broker_runtime.client.consumer_options import HOLD_CHECK_S, ConsumerOptions
from broker_runtime.client.instance import ClientInstance
from broker_runtime.client.model import ConsumeFromWhere, MessageModel, PullStatus, ReceivedMessage
from broker_runtime.client.offset_store import (
    NO_OFFSET,
    LocalFileOffsetStore,
    OffsetStore,
    ReadType,
    RemoteBrokerOffsetStore,
    default_offsets_dir,
    reset_offsets,
)
from broker_runtime.client.process_queue import ProcessQueue
from broker_runtime.client.puller import Puller
from broker_runtime.client.rebalance import MessageQueue
from broker_runtime.client.route import read_queues
from broker_runtime.client.tag_filter import Subscription, parse
from broker_runtime.common.clock import SystemClock
from broker_runtime.common.topics import is_retry_topic, validate_group, validate_topic
from broker_runtime.remoting.bodies import (
    BodyError,
    ConsumerData,
    HeartbeatData,
    SubscriptionData,
    decode_json,
)
from broker_runtime.remoting.command import RemotingCommand
from broker_runtime.remoting.connection import Connection
from broker_runtime.remoting.protocol import RequestCode

log = logging.getLogger(__name__)


class ConsumerBase:
    consume_type = "CONSUME_PASSIVELY"
    commit_on_pull = True  # piggy-back the queue's offset on each pull (push consumers do)
    pull_errors: dict[MessageQueue, str]  # why a queue's last pull failed, until one succeeds

    def __init__(
        self,
        config: ClientConfig | str,
        group: str,
        options: ConsumerOptions | None = None,
    ) -> None:
        o = options or ConsumerOptions()
        self.config = ClientConfig(config) if isinstance(config, str) else config
        self.group = validate_group(group)
        self.model = MessageModel(o.message_model)
        self.consume_from = ConsumeFromWhere(o.consume_from)
        self.clock = o.clock or SystemClock()
        self.consume_timestamp_ms = o.start_timestamp_ms(self.clock.now_ms())
        self.allocate = o.allocate
        self.rebalance_interval_s = o.rebalance_interval_s
        self.client_id = self.config.client_id(unique=self.model is MessageModel.CLUSTERING)
        self.subscriptions: dict[str, Subscription] = {}
        self.pq_table: dict[MessageQueue, ProcessQueue] = {}
        self.instance = ClientInstance(
            self.config,
            self.client_id,
            self._heartbeat_data,
            lambda: list(self.subscriptions),
            handlers={
                RequestCode.NOTIFY_CONSUMER_IDS_CHANGED: self._on_ids_changed,
                RequestCode.RESET_CONSUMER_CLIENT_OFFSET: self._on_reset_offset,
            },
        )
        self.puller = Puller(self.instance, self.group)
        self.offset_store: OffsetStore
        if self.model is MessageModel.BROADCASTING:
            base = o.offsets_dir or default_offsets_dir()
            self.offset_store = LocalFileOffsetStore(base, self.client_id, self.group)
        else:
            self.offset_store = RemoteBrokerOffsetStore(self._fetch_offset, self._commit_offset)
        self.pull_batch_size = o.pull_batch_size
        self.suspend_ms = o.suspend_ms
        self.pull_delay_on_error_s = o.pull_delay_on_error_s
        self._pull_tasks: dict[MessageQueue, asyncio.Task[None]] = {}
        self.running = False
        self._wakeup: asyncio.Event | None = None
        self._rebalance_lock: asyncio.Lock | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()

    # -- subscriptions ----------------------------------------------------------------------
    def subscribe(self, topic: str, expression: str = "*", expression_type: str = "TAG") -> None:
        """Subscribe to `topic` with a tag expression (`*`, `TAGA || TAGB`), or with a SQL92
        one over message properties (`expression_type="SQL92"`, as MessageSelector.bySql).

        On a started consumer, call it on the consumer's event loop: the brokers hear of it
        at once and a rebalance follows.
        """
        self.subscriptions[validate_topic(topic)] = parse(topic, expression, expression_type)
        self._subscriptions_changed()

    def unsubscribe(self, topic: str) -> None:
        self.subscriptions.pop(topic, None)
        self._subscriptions_changed()

    def _subscriptions_changed(self) -> None:
        if not self.running:
            return

        async def announce() -> None:
            await self.instance.refresh_routes()
            await self.instance.heartbeat_all()
            self.rebalance_now()

        task = asyncio.get_running_loop().create_task(announce())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _heartbeat_data(self) -> HeartbeatData:
        subs = [
            SubscriptionData(t, s.expression, s.expression_type, s.sub_version)
            for t, s in self.subscriptions.items()
        ]
        consumer = ConsumerData(
            self.group, self.model.value, self.consume_type, self.consume_from.value, subs
        )
        return HeartbeatData(self.client_id, consumers=[consumer])

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        """Raises MQBrokerError when a broker refuses this consumer (ACL: NO_PERMISSION)."""
        self._wakeup = asyncio.Event()
        self._rebalance_lock = asyncio.Lock()
        self.pull_errors = {}
        await self.offset_store.load()
        await self.instance.start()
        refused = self.instance.api.refused
        if refused is not None:  # its heartbeats were refused: it would wait for ever
            await self.instance.close()
            raise refused
        self.running = True
        self.instance.every(self.config.persist_offset_interval_s, self.persist_offsets)
        self._loop_task = asyncio.get_running_loop().create_task(self._rebalance_loop())
        self._wakeup.set()

    async def __aenter__(self) -> Self:  # `async with` (subscribe first): start, then shutdown
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    async def shutdown(self, grace_s: float = 0.0) -> None:
        """Stop pulling, persist offsets, leave the group (the others rebalance at once).

        Messages still being consumed after `grace_s` are not committed: redelivered later.
        """
        if not self.running:
            return
        self.running = False
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        await self._stop_consuming(grace_s)
        await self.persist_offsets()
        for pq in self.pq_table.values():
            pq.dropped = True
        await self.instance.unregister_all(None, self.group)
        await self.instance.close()

    async def _stop_consuming(self, grace_s: float) -> None:
        """Stop the pull loops; subclasses also stop consuming."""
        tasks = list(self._pull_tasks.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._pull_tasks.clear()

    async def persist_offsets(self) -> None:
        await self.offset_store.persist_all(list(self.pq_table))

    # -- rebalance --------------------------------------------------------------------------
    async def _on_ids_changed(self, cmd: RemotingCommand, conn: Connection) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    async def _on_reset_offset(self, cmd: RemotingCommand, conn: Connection) -> None:
        """An admin moved the group's offsets: drop those queues, commit the new offsets (the
        client's job: RocketMQ's broker only passes them on) and take the queues again."""
        if cmd.ext_fields.get("group") != self.group or self._rebalance_lock is None:
            return
        try:
            reset = reset_offsets(decode_json(cmd.body, "offset reset"))
        except (BodyError, KeyError, TypeError, ValueError) as e:
            log.warning("%s: bad offset reset notice: %s", self.client_id, e)
            return
        async with self._rebalance_lock:
            for mq, offset in reset.items():
                pq = self.pq_table.pop(mq, None)
                if pq is not None:
                    pq.dropped = True
                    self._queue_removed(mq, pq)
                self.offset_store.table.update(mq, offset)
                await self.offset_store.persist(mq)
        log.info("%s: offsets reset by admin for %d queue(s)", self.client_id, len(reset))
        self.rebalance_now()

    async def _rebalance_loop(self) -> None:
        assert self._wakeup is not None
        while self.running:
            try:
                await asyncio.wait_for(self._wakeup.wait(), self.rebalance_interval_s)
            except TimeoutError:
                pass
            self._wakeup.clear()
            try:
                await self.rebalance()
            except Exception as e:
                log.warning("%s: rebalance failed: %s", self.client_id, e)

    def rebalance_now(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    async def rebalance(self) -> None:
        assert self._rebalance_lock is not None
        async with self._rebalance_lock:
            for topic, _ in list(self.subscriptions.items()):
                wanted = await self._allocation(topic)
                if wanted is not None:
                    await self._update_queues(topic, wanted)
            for mq in [mq for mq in self.pq_table if mq.topic not in self.subscriptions]:
                await self._drop(mq)

    async def _allocation(self, topic: str) -> set[MessageQueue] | None:
        """The queues of `topic` this consumer should own; None: keep what it has."""
        route = self.instance.routes.get(topic) or await self.instance.update_route(topic)
        if route is None:
            level = logging.INFO if is_retry_topic(topic) else logging.WARNING
            log.log(level, "%s: topic %s has no route", self.client_id, topic)
            return None
        mq_all = read_queues(topic, route)
        if self.model is MessageModel.BROADCASTING or not mq_all:
            return set(mq_all)
        cids = await self._consumer_ids([b.broker_name for b in route.broker_datas])
        if not cids:
            return None
        return set(self.allocate(self.group, self.client_id, mq_all, cids))

    async def _consumer_ids(self, brokers: list[str]) -> list[str] | None:
        random.shuffle(brokers)  # findBrokerAddrByTopic: any broker of the topic
        for broker in brokers:
            try:
                return await self.instance.on_node(
                    broker, lambda addr: self.instance.api.consumer_ids(addr, self.group)
                )
            except Exception as e:
                log.info("%s: no consumer list from %s: %s", self.client_id, broker, e)
        return None

    async def _update_queues(self, topic: str, wanted: set[MessageQueue]) -> None:
        for mq in [mq for mq in self.pq_table if mq.topic == topic and mq not in wanted]:
            await self._drop(mq)
        for mq in sorted(wanted - set(self.pq_table)):
            try:
                offset = await self.compute_pull_from(mq)
            except Exception as e:
                log.warning("%s: no start offset for %s yet: %s", self.client_id, mq, e)
                continue
            pq = ProcessQueue(self.clock.now_ms())
            self.pq_table[mq] = pq
            self.offset_store.update(mq, offset)
            log.info("%s: took %s at offset %d", self.client_id, mq, offset)
            self._queue_added(mq, pq, offset)

    async def _drop(self, mq: MessageQueue) -> None:
        pq = self.pq_table.pop(mq)
        pq.dropped = True
        await self.offset_store.persist(mq)
        self.offset_store.remove(mq)
        log.info("%s: gave up %s", self.client_id, mq)
        self._queue_removed(mq, pq)

    def _queue_added(self, mq: MessageQueue, pq: ProcessQueue, offset: int) -> None:
        task = asyncio.get_running_loop().create_task(self._pull_loop(mq, pq, offset))
        self._pull_tasks[mq] = task

    def _queue_removed(self, mq: MessageQueue, pq: ProcessQueue) -> None:
        task = self._pull_tasks.pop(mq, None)
        if task is not None:
            task.cancel()

    # -- pulling ----------------------------------------------------------------------------
    def _flow_controlled(self, pq: ProcessQueue) -> bool:
        """Whether to hold off pulling into `pq` for a moment (subclasses set limits)."""
        return False

    def _deliver(self, mq: MessageQueue, pq: ProcessQueue, msgs: list[ReceivedMessage]) -> None:
        """Hand pulled messages (already in `pq`) to the application side."""
        raise NotImplementedError

    def _subscription(self, topic: str) -> Subscription | None:
        return self.subscriptions.get(topic)

    async def _pull_loop(self, mq: MessageQueue, pq: ProcessQueue, offset: int) -> None:
        """Pull `mq` from `offset` until dropped (pullMessage and its PullCallback as a loop)."""
        clustering = self.model is MessageModel.CLUSTERING
        timeout_s = self.suspend_ms / 1000 + HOLD_CHECK_S + self.config.request_timeout_s
        while self.running and not pq.dropped:
            if self._flow_controlled(pq):
                await asyncio.sleep(0.05)
                continue
            sub = self._subscription(mq.topic)
            if sub is None:
                return
            commit = self.offset_store.table.get(mq) if clustering and self.commit_on_pull else None
            started = time.monotonic()
            try:
                result = await self.puller.pull(
                    mq, sub, offset, self.pull_batch_size, commit, self.suspend_ms, timeout_s
                )
            except Exception as e:
                log.warning("%s: pull of %s failed: %s", self.client_id, mq, e)
                self.pull_errors[mq] = str(e)
                await asyncio.sleep(self.pull_delay_on_error_s)
                continue
            self.pull_errors.pop(mq, None)
            if pq.dropped:
                return
            pq.last_pull_ms = self.clock.now_ms()
            if result.status is PullStatus.OFFSET_ILLEGAL:
                log.warning(
                    "%s: offset %d of %s is illegal, moving to %d",
                    *(self.client_id, offset, mq, result.next_begin_offset),
                )
                self.offset_store.update(mq, result.next_begin_offset)
                await self.offset_store.persist(mq)
            offset = result.next_begin_offset
            if result.messages:
                pq.put(result.messages)
                pq.pulled_to(offset)
                self._deliver(mq, pq, result.messages)
            elif len(pq) == 0:  # correctTagsOffset: nothing in flight, skip what was filtered
                self.offset_store.update(mq, offset, increase_only=True)
            if result.status is PullStatus.NO_NEW_MSG and time.monotonic() - started < 0.005:
                await asyncio.sleep(0.1)  # answered at once: that broker does no long polling

    # -- offsets ----------------------------------------------------------------------------
    async def compute_pull_from(self, mq: MessageQueue) -> int:
        """The committed offset, else the start `consume_from` names (computePullFromWhere)."""
        last = await self.offset_store.read(mq, ReadType.STORE)
        if last >= 0:
            return last
        if self.consume_from is ConsumeFromWhere.FIRST_OFFSET:
            return 0
        if self.consume_from is ConsumeFromWhere.LAST_OFFSET and is_retry_topic(mq.topic):
            return 0
        if self.consume_from is ConsumeFromWhere.LAST_OFFSET or is_retry_topic(mq.topic):
            return await self.max_offset(mq)
        return await self.search_offset(mq, self.consume_timestamp_ms)

    async def max_offset(self, mq: MessageQueue) -> int:
        return await self._queue_offset(RequestCode.GET_MAX_OFFSET, mq, None)

    async def min_offset(self, mq: MessageQueue) -> int:
        return await self._queue_offset(RequestCode.GET_MIN_OFFSET, mq, None)

    async def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        return await self._queue_offset(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, mq, timestamp_ms)

    async def _queue_offset(self, code: int, mq: MessageQueue, ts: int | None) -> int:
        api = self.instance.api
        return await self.instance.on_node(
            mq.broker, lambda addr: api.queue_offset(addr, code, mq, ts)
        )

    async def _fetch_offset(self, mq: MessageQueue) -> int:
        api = self.instance.api
        off = await self.instance.on_node(
            mq.broker, lambda addr: api.query_consumer_offset(addr, self.group, mq)
        )
        return off if off >= 0 else NO_OFFSET

    async def _commit_offset(self, mq: MessageQueue, offset: int) -> None:
        api = self.instance.api
        await self.instance.on_node(
            mq.broker, lambda addr: api.update_consumer_offset(addr, self.group, mq, offset)
        )
