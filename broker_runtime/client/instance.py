"""What every producer and consumer needs (RocketMQ's MQClientInstance): the route cache,
broker addresses, heartbeats, and periodic jobs on the event loop."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TypeVar

from broker_runtime.client.api import MQClientAPI
from broker_runtime.client.config import ClientConfig
from broker_runtime.client.model import MQClientError
from broker_runtime.client.rebalance import MessageQueue
from broker_runtime.client.route import PublishInfo, pick_read_addr, write_queues
from broker_runtime.remoting.bodies import MASTER_ID, HeartbeatData, TopicRouteData
from broker_runtime.remoting.connection import ConnectionClosedError, RemotingConnectError
from broker_runtime.remoting.protocol import RequestCode
from broker_runtime.remoting.server import Processor

log = logging.getLogger(__name__)
T = TypeVar("T")


class ClientInstance:
    """Owned by one producer or consumer; all methods run on its event loop."""

    def __init__(
        self,
        config: ClientConfig,
        client_id: str,
        heartbeat_data: Callable[[], HeartbeatData],
        topics: Callable[[], Iterable[str]],
        handlers: Mapping[int, Processor] | None = None,
        down_ttl_s: float = 10.0,
    ) -> None:
        self.config = config
        self.client_id = client_id
        self.api = MQClientAPI(config, handlers)
        self.routes: dict[str, TopicRouteData] = {}
        self.publish: dict[str, PublishInfo] = {}
        self.brokers: dict[str, dict[int, str]] = {}
        self._heartbeat_data = heartbeat_data
        self._topics = topics
        self._down: dict[str, float] = {}  # address -> monotonic time it may be tried again
        self.down_ttl_s = down_ttl_s
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        await self.refresh_routes()
        await self.heartbeat_all()
        self.every(self.config.poll_name_server_interval_s, self.refresh_routes)
        self.every(self.config.heartbeat_interval_s, self.heartbeat_all)

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self.api.close()

    def every(self, interval_s: float, job: Callable[[], Awaitable[None]]) -> None:
        """Run `job` every `interval_s` until close; a failing run is logged, not fatal."""

        async def loop() -> None:
            while True:
                await asyncio.sleep(interval_s)
                try:
                    await job()
                except Exception as e:
                    log.warning("%s: periodic %s failed: %s", self.client_id, job.__name__, e)

        self._tasks.append(asyncio.get_running_loop().create_task(loop()))

    # -- routes -----------------------------------------------------------------------------
    async def update_route(self, topic: str) -> TopicRouteData | None:
        route = await self.api.get_route(topic)
        if route is None:
            return None
        if self.routes.get(topic) != route:
            self.routes[topic] = route
            self.publish[topic] = PublishInfo(write_queues(topic, route))
            known = {a for addrs in self.brokers.values() for a in addrs.values()}
            for b in route.broker_datas:
                self.brokers[b.broker_name] = dict(b.broker_addrs)
            if any(a not in known for b in route.broker_datas for a in b.broker_addrs.values()):
                # A broker first met now hears this client's groups at once, not up to a
                # heartbeat interval later: a transaction check-back needs the producer's.
                task = asyncio.get_running_loop().create_task(self.heartbeat_all())
                self._tasks.append(task)
        return route

    async def refresh_routes(self) -> None:
        for topic in list(dict.fromkeys([*self._topics(), *self.routes])):
            try:
                await self.update_route(topic)
            except Exception as e:
                log.warning("%s: route of %s not refreshed: %s", self.client_id, topic, e)

    async def publish_info(self, topic: str, default_queue_nums: int = 0) -> PublishInfo:
        """Where `topic` can be sent to. A topic no name server knows gets, when
        `default_queue_nums` > 0, that many queues on every master of the cluster: brokers
        with autoCreateTopicEnable create it on the first send (RocketMQ's TBW102 route)."""
        info = self.publish.get(topic)
        if info is None or not info.ok():
            if await self.update_route(topic) is None and default_queue_nums > 0:
                await self._default_route(topic, default_queue_nums)
            info = self.publish.get(topic)
        if info is None or not info.ok():
            raise MQClientError(f"no route to send to topic {topic!r} (create it first?)")
        return info

    async def _default_route(self, topic: str, queue_nums: int) -> None:
        cluster = await self.api.namesrv_json(RequestCode.GET_BROKER_CLUSTER_INFO)
        queues = []
        for name, data in sorted(cluster.get("brokerAddrTable", {}).items()):
            addrs = {int(k): str(v) for k, v in data.get("brokerAddrs", {}).items()}
            if MASTER_ID in addrs:
                self.brokers[name] = addrs
                queues += [MessageQueue(topic, name, i) for i in range(queue_nums)]
        self.publish[topic] = PublishInfo(queues)

    async def master_addr(self, broker: str, topic: str | None = None) -> str:
        addr = self.brokers.get(broker, {}).get(MASTER_ID)
        if addr is None and topic is not None:
            await self.update_route(topic)
            addr = self.brokers.get(broker, {}).get(MASTER_ID)
        if addr is None:
            raise MQClientError(f"broker {broker} has no master in the route")
        return addr

    def read_addr(self, broker: str, suggested_id: int = MASTER_ID) -> tuple[int, str]:
        """The node of `broker` to read from, passing over nodes that just failed."""
        found = pick_read_addr(self.brokers.get(broker, {}), suggested_id, self.down_addrs())
        if found is None:
            raise MQClientError(f"broker {broker} is not in any route")
        return found

    async def on_node(
        self, broker: str, call: Callable[[str], Awaitable[T]], suggested_id: int = MASTER_ID
    ) -> T:
        """`call(addr)` on the master of `broker`, or on a slave when the master is down.

        A node that refuses the connection is marked down and the next one is tried.
        """
        tried = 0
        while True:
            addr = self.read_addr(broker, suggested_id)[1]
            try:
                result = await call(addr)
            except (RemotingConnectError, ConnectionClosedError):
                self.mark_down(addr)
                tried += 1
                if tried >= len(self.brokers.get(broker, {})):
                    raise
                continue
            self.mark_up(addr)
            return result

    # -- failed nodes -------------------------------------------------------------------------
    def mark_down(self, addr: str) -> None:
        self._down[addr] = time.monotonic() + self.down_ttl_s

    def mark_up(self, addr: str) -> None:
        self._down.pop(addr, None)

    def down_addrs(self) -> set[str]:
        now = time.monotonic()
        for addr, until in list(self._down.items()):
            if until <= now:
                del self._down[addr]
        return set(self._down)

    # -- heartbeats -------------------------------------------------------------------------
    async def heartbeat_all(self) -> None:
        """HEART_BEAT to every master, and to slaves too when this client consumes."""
        data = self._heartbeat_data()
        to_slaves = bool(data.consumers)
        for broker, addrs in list(self.brokers.items()):
            for broker_id, addr in addrs.items():
                if broker_id != MASTER_ID and not to_slaves:
                    continue
                try:
                    await self.api.heartbeat(addr, data)
                except Exception as e:
                    log.info("%s: heartbeat to %s (%s) failed: %s", self.client_id, broker, addr, e)

    async def unregister_all(self, producer_group: str | None, consumer_group: str | None) -> None:
        async def one(addr: str) -> None:
            try:
                await self.api.unregister(addr, self.client_id, producer_group, consumer_group)
            except Exception as e:
                log.info("%s: unregister at %s failed: %s", self.client_id, addr, e)

        addrs = {a for group in self.brokers.values() for a in group.values()}
        await asyncio.gather(*(one(a) for a in sorted(addrs)))
