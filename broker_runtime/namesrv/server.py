"""The name server process: the route table behind a remoting server, and its housekeeping."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from broker_runtime.common.clock import Clock, SystemClock
from broker_runtime.common.config import NamesrvConfig
from broker_runtime.common.topics import validate_topic
from broker_runtime.namesrv.route_table import RouteTable, TopicQueues
from broker_runtime.remoting.bodies import BodyError, decode_json, encode_json
from broker_runtime.remoting.command import RemotingCommand, response_to
from broker_runtime.remoting.connection import Connection
from broker_runtime.remoting.headers import (
    RegisterBrokerRequestHeader,
    RegisterBrokerResponseHeader,
    TopicHeader,
    UnregisterBrokerRequestHeader,
)
from broker_runtime.remoting.protocol import RequestCode, ResponseCode
from broker_runtime.remoting.server import ProcessorTable, RemotingServer

log = logging.getLogger(__name__)


def parse_topic_config_table(body: bytes) -> dict[str, TopicQueues] | None:
    """The topics a REGISTER_BROKER body carries (None for an empty body)."""
    if not body:
        return None
    table = decode_json(body, "register").get("topicConfigTable", {})
    if not isinstance(table, dict):
        raise BodyError("topicConfigTable is not an object")
    topics: dict[str, TopicQueues] = {}
    for topic, cfg in table.items():
        validate_topic(topic)
        try:
            topics[topic] = TopicQueues(
                int(cfg["readQueueNums"]), int(cfg["writeQueueNums"]), int(cfg.get("perm", 6))
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise BodyError(f"topic {topic!r} has a bad config: {e!r}") from None
    return topics


class NameServer:
    def __init__(self, config: NamesrvConfig, clock: Clock | None = None) -> None:
        self.config = config
        self.clock = clock or SystemClock()
        self.routes = RouteTable()
        table = ProcessorTable()
        table.register(RequestCode.REGISTER_BROKER, self.register_broker)
        table.register(RequestCode.UNREGISTER_BROKER, self.unregister_broker)
        table.register(RequestCode.GET_ROUTEINFO_BY_TOPIC, self.get_route)
        table.register(RequestCode.GET_BROKER_CLUSTER_INFO, self.cluster_info)
        table.register(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, self.topic_list)
        self.server = RemotingServer(table, config.host, config.port)
        self._watched: set[Connection] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        port = await self.server.start()
        self._spawn(self._scan_loop())
        log.info("name server listening on %s:%d", self.config.host, port)
        return port

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.server.close()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _scan_loop(self) -> None:
        """scanNotActiveBroker: drop brokers that stopped sending heartbeats."""
        while True:
            await asyncio.sleep(self.config.scan_interval_ms / 1000)
            for addr in self.routes.expire(self.clock.now_ms(), self.config.broker_expiry_ms):
                log.warning(
                    "broker %s expired: no heartbeat for over %d ms",
                    addr,
                    self.config.broker_expiry_ms,
                )

    async def _watch(self, conn: Connection) -> None:
        await conn.wait_closed()
        self._watched.discard(conn)
        for addr in self.routes.channel_closed(conn):
            log.warning("broker %s dropped: its connection closed", addr)

    # -- processors -------------------------------------------------------------------------

    async def register_broker(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        h = RegisterBrokerRequestHeader.decode(cmd)
        topics = parse_topic_config_table(cmd.body)
        master, master_ha = self.routes.register(
            h.cluster_name,
            h.broker_addr,
            h.broker_name,
            h.broker_id,
            h.ha_server_addr,
            topics,
            self.clock.now_ms(),
            conn,
        )
        if conn not in self._watched:
            self._watched.add(conn)
            self._spawn(self._watch(conn))
        out = RegisterBrokerResponseHeader(ha_server_addr=master_ha, master_addr=master)
        return response_to(cmd, ResponseCode.SUCCESS, fields=out.fields())

    async def unregister_broker(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        h = UnregisterBrokerRequestHeader.decode(cmd)
        known = self.routes.unregister(h.broker_addr, h.broker_name, h.broker_id)
        log.info("broker %s (%s/%d) unregistered", h.broker_addr, h.broker_name, h.broker_id)
        return response_to(cmd, ResponseCode.SUCCESS, None if known else "was not registered")

    async def get_route(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        topic = TopicHeader.decode(cmd).topic
        route = self.routes.route(topic) if topic else None
        if route is None:
            return response_to(
                cmd, ResponseCode.TOPIC_NOT_EXIST, f"no topic route info in name server: {topic}"
            )
        return response_to(cmd, ResponseCode.SUCCESS, body=route.encode())

    async def cluster_info(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        return response_to(cmd, ResponseCode.SUCCESS, body=encode_json(self.routes.cluster_info()))

    async def topic_list(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        body = encode_json({"topicList": self.routes.topics()})
        return response_to(cmd, ResponseCode.SUCCESS, body=body)
