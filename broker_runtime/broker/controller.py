"""The broker: its store, tables, processors, replication and name-server registration wired
together (RocketMQ's BrokerController), and the puts every write path goes through.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from broker_runtime.acl.accounts import Account, admin_account, load_accounts
from broker_runtime.acl.signing import sign_command
from broker_runtime.acl.validator import AclValidator
from broker_runtime.broker.consumer_manager import ConsumerManager
from broker_runtime.broker.damaged_units import DamagedUnits
from broker_runtime.broker.long_polling import PullHoldService
from broker_runtime.broker.queue_access import QueueAccessLocks
from broker_runtime.broker.rebalance_lock import RebalanceLockManager
from broker_runtime.broker.schedule import ScheduleService
from broker_runtime.broker.stats import BrokerStats
from broker_runtime.broker.subscription_groups import SubscriptionGroupManager
from broker_runtime.broker.topic_config import (
    MAX_QUEUES,
    PERM_RW,
    TopicConfig,
    TopicConfigManager,
)
from broker_runtime.broker.transactions import TransactionService
from broker_runtime.common.clock import Clock, SystemClock
from broker_runtime.common.config import BrokerConfig, BrokerRole, FlushMode
from broker_runtime.common.delay import to_schedule
from broker_runtime.common.message import Message
from broker_runtime.common.topics import AUTO_CREATE_TOPIC
from broker_runtime.ha.master import HAMasterService
from broker_runtime.ha.slave import HASlaveClient
from broker_runtime.offsets.consumer_filters import ConsumerFilterManager
from broker_runtime.offsets.consumer_offsets import ConsumerOffsets
from broker_runtime.remoting.bodies import PERM_INHERIT, PERM_READ
from broker_runtime.remoting.client import RemotingClient
from broker_runtime.remoting.command import RemotingCommand
from broker_runtime.remoting.protocol import ResponseCode
from broker_runtime.remoting.server import ProcessorTable, RemotingServer
from broker_runtime.store.commit_log import PutResult
from broker_runtime.store.message_store import MessageStore

log = logging.getLogger(__name__)


class BrokerController:
    def __init__(self, config: BrokerConfig, clock: Clock | None = None) -> None:
        self.config = config
        self.clock = clock or SystemClock()
        self.role = config.role
        self.store: MessageStore | None = None
        self.topics = TopicConfigManager(config.store.store_dir)
        if config.auto_create_topic:  # the route clients send a new topic by (TopicConfigManager)
            n = config.default_queue_nums
            self.topics.add_system(TopicConfig(AUTO_CREATE_TOPIC, n, n, PERM_RW | PERM_INHERIT))
        self.groups = SubscriptionGroupManager(
            config.store.store_dir,
            config.auto_create_subscription_group,
            config.max_reconsume_times,
        )
        self.offsets = ConsumerOffsets(config.store.store_dir)
        self.filters = ConsumerFilterManager(config.store.store_dir, self.clock.now_ms())
        self.damaged = DamagedUnits(config.store.store_dir)
        self.consumers = ConsumerManager()
        self.stats = BrokerStats(self.clock.now_ms())
        self.delay_levels = config.store.delay_levels()
        self.schedule: ScheduleService | None = None  # masters only, once the store is open
        self.transactions = TransactionService(self)
        self.order_locks = RebalanceLockManager(config.rebalance_lock_max_live_ms)
        self.access: QueueAccessLocks | None = (
            QueueAccessLocks(config.queue_lock_hold_timeout_ms)
            if config.queue_access_lock
            else None
        )
        self.accounts: dict[str, Account] = (
            load_accounts(config.acl_file) if config.acl_enable and config.acl_file else {}
        )
        self.table = ProcessorTable(
            hooks=[AclValidator(self.accounts)] if config.acl_enable else []
        )
        self.server = RemotingServer(self.table, config.host, config.port)
        self.outbound = RemotingClient()
        self.executor = ThreadPoolExecutor(32, thread_name_prefix="put")
        self.ha_master: HAMasterService | None = None
        self.ha_slave: HASlaveClient | None = None
        self.hold: PullHoldService | None = None
        self.master_addr: str | None = None  # learned from the name servers (slaves)
        self.master_ha_addr: str | None = config.ha_master_addr
        self._tasks: set[asyncio.Task[Any]] = set()
        self._watched: set[object] = set()
        self._register_now = asyncio.Event()
        self.started = False

    @property
    def name(self) -> str:
        return f"{self.config.broker_name}/{self.config.broker_id}"

    @property
    def is_master(self) -> bool:
        return self.role.is_master

    def require_store(self) -> MessageStore:
        if self.store is None:
            raise RuntimeError("the store is not open")
        return self.store

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        from broker_runtime.broker.processors import register_processors
        from broker_runtime.broker.tasks import background_tasks

        loop = asyncio.get_running_loop()
        self.store = store = await loop.run_in_executor(None, MessageStore, self.config.store)
        (store.root / "commitlog").mkdir(exist_ok=True)  # a store dir even before any message
        rec = store.recovery
        log.info(
            "store open: log %d..%d, unclean=%s, %d bytes cut",
            rec.log_min_offset,
            rec.log_end,
            rec.unclean_shutdown,
            rec.truncated_bytes,
        )
        self.hold = PullHoldService(loop)
        store.dispatcher.listeners.append(self.hold.on_dispatched)
        register_processors(self)
        await self.server.start()
        secret = self.replication_secret()
        if secret is None:
            log.warning("the HA link is not authenticated (no ACL, no ha_secret_file)")
        if self.is_master:
            self.ha_master = HAMasterService(store, self.config, secret)
            await self.ha_master.start()
        else:
            self.ha_slave = HASlaveClient(store, self.config, lambda: self.master_ha_addr, secret)
            self.ha_slave.start()
        for coro in background_tasks(self):
            self.spawn(coro)
        if self.is_master:
            self.schedule = ScheduleService(
                store, self.delay_levels, self.clock, self.config.store.store_dir
            )
            every = self.config.delay_offset_persist_interval_ms
            self.spawn(self.schedule.run(self.put_back, every))
            self.transactions.ensure_topics()
        self.spawn(self.transactions.run())
        self.started = True
        log.info(
            "broker %s (%s) serving on %s, HA %s",
            self.name,
            self.role.value,
            self.config.addr,
            self.ha_master.port if self.ha_master else self.master_ha_addr,
        )

    async def stop(self) -> None:
        """Clean stop: no new requests, unregister, persist tables, shut the store down."""
        from broker_runtime.broker.namesrv_client import unregister_all

        await self.server.close(grace_s=1.0)
        if self.started:
            try:
                await asyncio.wait_for(unregister_all(self), 3.0)
            except Exception as e:  # the name servers expire us anyway
                log.warning("unregister failed: %s", e)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.schedule is not None:
            try:
                self.schedule.persist()
            except OSError as e:
                log.error("writing delayOffset.json at stop failed: %s", e)
        if self.ha_master is not None:
            await self.ha_master.stop()
        if self.ha_slave is not None:
            await self.ha_slave.stop()
        await self.outbound.close()
        self.offsets.persist()
        self.filters.persist(self.clock.now_ms())
        self.executor.shutdown(wait=True)
        if self.store is not None:
            self.store.shutdown()
        log.info("broker %s stopped", self.name)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task failed", exc_info=task.exception())

    def register_soon(self) -> None:
        """Re-register with the name servers now (a topic was created)."""
        self._register_now.set()

    # -- writes -----------------------------------------------------------------------------

    async def put(self, msgs: list[Message]) -> list[PutResult]:
        """Store messages; the event loop never waits on an fsync.

        A message with DELAY > 0 is stored under SCHEDULE_TOPIC_XXXX (CommitLog.putMessage);
        a DELAY that is not a number raises DelayLevelError (a ValueError).
        """
        store = self.require_store()
        levels = self.delay_levels
        msgs = [to_schedule(m, levels) for m in msgs]
        self.stats.on_put(len(msgs))
        if self.config.store.flush is FlushMode.SYNC:
            loop = asyncio.get_running_loop()
            results = await loop.run_in_executor(self.executor, store.put_messages, msgs)
        else:
            results = store.put_messages(msgs)
        if self.ha_master is not None:
            self.ha_master.notify()
        return results

    async def replicate(self, end: int) -> tuple[int, str | None]:
        """SYNC_MASTER: wait until a slave has the log up to `end` (handleHA)."""
        if self.role is not BrokerRole.SYNC_MASTER or self.ha_master is None:
            return ResponseCode.SUCCESS, None
        if not self.ha_master.slave_ok(end):
            return ResponseCode.SLAVE_NOT_AVAILABLE, "no slave connected, or it is too far behind"
        timeout = self.config.sync_replica_timeout_ms / 1000
        if await self.ha_master.wait_replicated(end, timeout):
            return ResponseCode.SUCCESS, None
        return ResponseCode.FLUSH_SLAVE_TIMEOUT, f"no slave acknowledged within {timeout:g} s"

    async def put_back(self, msgs: list[Message]) -> None:
        """The schedule service's put: store, then replicate as a send would."""
        results = await self.put(msgs)
        last = results[-1]
        code, remark = await self.replicate(last.phys_offset + last.size)
        if code != ResponseCode.SUCCESS:
            log.warning("delayed messages stored but not replicated: %s", remark)

    def ensure_topic(self, topic: str, queue_nums: int, perm: int) -> TopicConfig:
        """A retry or dead-letter topic, created (and registered) if it does not exist yet.

        As createTopicInSendMessageBackMethod: regardless of auto-create, on masters only
        (a slave takes its master's table).
        """
        cfg = self.topics.get(topic)
        if cfg is None:
            cfg = TopicConfig(topic, queue_nums, queue_nums, perm)
            if self.is_master:
                self.topics.put(cfg)
                log.info("topic %s created: %d queue(s), perm %d", topic, queue_nums, perm)
                self.register_soon()
        return cfg

    def topic_for_send(self, topic: str, queue_nums: int | None = None) -> TopicConfig | None:
        """The topic's config, created if auto-create is on: with `queue_nums` queues (the
        client's defaultTopicQueueNums), at most the broker's default_queue_nums."""
        cfg = self.topics.get(topic)
        if cfg is None and self.config.auto_create_topic and self.is_master:
            n = self.config.default_queue_nums  # the AUTO_CREATE_TOPIC's queues
            if queue_nums is not None:  # createTopicInSendMessageMethod: the client's wish
                n = max(1, min(queue_nums, n))
            cfg = TopicConfig(topic, n, n)
            self.topics.put(cfg)
            log.info("topic %s auto-created with %d queues", topic, n)
            self.register_soon()
        return cfg

    def topic_for_read(self, topic: str, queue_id: int) -> TopicConfig | None:
        """The topic's config for a pull. A slave copies its master's topic table every
        slave_sync_interval_ms, and not at all while the master is down: a topic created since
        its last copy is then still readable from the queues its replicated log built (with
        `queue_id` among them: an empty queue has no files yet), so consumers read what the
        slave holds instead of TOPIC_NOT_EXIST."""
        cfg = self.topics.get(topic)
        if cfg is not None or self.is_master or self.store is None:
            return cfg
        held = [q for t, q in self.store.queues() if t == topic]
        if not held:
            return None
        n = min(max(*held, queue_id) + 1, MAX_QUEUES)
        return TopicConfig(topic, n, n, PERM_READ)

    def replication_secret(self) -> bytes | None:
        """What slaves prove to their master: ha_secret_file, else the ACL admin's secret."""
        if self.config.ha_secret_file is not None:
            secret = self.config.ha_secret_file.read_bytes().strip()
            if not secret:
                raise ValueError(f"{self.config.ha_secret_file} is empty")
            return secret
        account = admin_account(self.accounts) if self.config.acl_enable else None
        return account.secret_key.encode() if account is not None else None

    # -- calls out --------------------------------------------------------------------------

    async def call(self, addr: str, cmd: RemotingCommand, timeout: float = 3.0) -> RemotingCommand:
        """A request to a name server or another broker, signed when ACL is on."""
        account = admin_account(self.accounts) if self.config.acl_enable else None
        if account is not None:
            sign_command(cmd, account.access_key, account.secret_key)
        return await self.outbound.invoke(addr, cmd, timeout)
