"""Admin requests (RocketMQ's MQAdminImpl / DefaultMQAdminExt), for `mqaudit admin` and the
pipeline: topics, per-queue offsets, a group's progress, offset reset, message lookup.

Rows come back as dicts with mqadmin's column meanings; formatting is the CLI's job.
"""

from __future__ import annotations

import asyncio
from typing import Any

from broker_runtime.client.api import decode_messages
from broker_runtime.client.config import ClientConfig
from broker_runtime.client.instance import ClientInstance
from broker_runtime.client.model import MQBrokerError, MQClientError, ReceivedMessage
from broker_runtime.common.message import decode_offset_msg_id
from broker_runtime.common.topics import validate_group, validate_topic
from broker_runtime.remoting.bodies import MASTER_ID, HeartbeatData
from broker_runtime.remoting.command import request
from broker_runtime.remoting.connection import RemotingError
from broker_runtime.remoting.headers import (
    CreateTopicRequestHeader,
    QueryMessageRequestHeader,
    ResetOffsetRequestHeader,
    TopicHeader,
    ViewMessageRequestHeader,
)
from broker_runtime.remoting.protocol import RequestCode, ResponseCode


class MQAdmin:
    """Short-lived: `async with MQAdmin(ns) as admin: ...` (no heartbeats, no periodic jobs)."""

    def __init__(self, config: ClientConfig | str) -> None:
        self.config = ClientConfig(config) if isinstance(config, str) else config
        self.instance = ClientInstance(
            self.config, self.config.client_id(), lambda: HeartbeatData(""), lambda: []
        )
        self.api = self.instance.api

    async def __aenter__(self) -> MQAdmin:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.instance.close()

    # -- cluster and topics -----------------------------------------------------------------
    async def masters(self) -> dict[str, str]:
        """brokerName -> master address, from the name server's cluster info."""
        info = await self.api.namesrv_json(RequestCode.GET_BROKER_CLUSTER_INFO)
        out = {}
        for name, data in sorted(info.get("brokerAddrTable", {}).items()):
            addrs = {int(k): str(v) for k, v in data.get("brokerAddrs", {}).items()}
            self.instance.brokers.setdefault(name, addrs)
            if MASTER_ID in addrs:
                out[name] = addrs[MASTER_ID]
        return out

    async def topic_list(self) -> list[str]:
        data = await self.api.namesrv_json(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
        return sorted(str(t) for t in data.get("topicList", []))

    async def topic_create(
        self, topic: str, queues: int = 4, brokers: list[str] | None = None, perm: int = 6
    ) -> list[str]:
        """Create or update `topic` on the masters of `brokers` (default: all); their names."""
        validate_topic(topic)
        masters = await self.masters()
        chosen = brokers or sorted(masters)
        missing = [b for b in chosen if b not in masters]
        if missing:
            raise MQClientError(f"no master known for broker(s) {', '.join(missing)}")
        header = CreateTopicRequestHeader(topic, queues, queues, perm)
        for name in chosen:
            cmd = request(RequestCode.UPDATE_AND_CREATE_TOPIC, header.fields())
            self.api.check(await self.api.invoke(masters[name], cmd), masters[name])
        return chosen

    async def _route_brokers(self, topic: str) -> list[str]:
        route = await self.instance.update_route(validate_topic(topic))
        if route is None:
            raise MQClientError(f"topic {topic!r} has no route: it does not exist")
        return sorted(b.broker_name for b in route.broker_datas)

    async def _on_each(self, brokers: list[str], code: int, fields: dict[str, object]) -> list[Any]:
        """The same request to a live node of each broker group, concurrently."""

        async def one(broker: str) -> Any:
            return await self.instance.on_node(
                broker, lambda addr: self.api.broker_json(addr, code, fields)
            )

        return list(await asyncio.gather(*(one(b) for b in brokers)))

    async def topic_status(self, topic: str) -> list[dict[str, Any]]:
        """Per queue: brokerName, queueId, minOffset, maxOffset, lastUpdateTimestamp."""
        brokers = await self._route_brokers(topic)
        fields = TopicHeader(topic=topic).fields()
        rows = [
            r
            for data in await self._on_each(brokers, RequestCode.GET_TOPIC_STATS_INFO, fields)
            for r in data.get("offsetTable", [])
        ]
        return sorted(rows, key=lambda r: (r["brokerName"], r["queueId"]))

    async def consumer_progress(self, group: str, topic: str | None = None) -> list[dict[str, Any]]:
        """Per queue: topic, brokerName, queueId, brokerOffset, consumerOffset, diff and
        lastTimestamp (store time of the last consumed message)."""
        validate_group(group)
        brokers = await self._route_brokers(topic) if topic else sorted(await self.masters())
        fields = TopicHeader(topic=topic, consumer_group=group).fields()
        rows: list[dict[str, Any]] = []
        for broker in brokers:
            try:
                data = (await self._on_each([broker], RequestCode.GET_CONSUME_STATS, fields))[0]
            except MQBrokerError as e:
                if e.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST:
                    continue  # the group never consumed from this broker
                raise
            rows += data.get("offsetTable", [])
        if not rows:
            raise MQClientError(f"group {group} has no consume progress on any broker")
        for r in rows:
            consumer = r["consumerOffset"]
            r["diff"] = r["brokerOffset"] - max(consumer, 0)
        return sorted(rows, key=lambda r: (r["topic"], r["brokerName"], r["queueId"]))

    async def reset_offset_by_time(
        self, group: str, topic: str, timestamp_ms: int
    ) -> list[dict[str, Any]]:
        """Move the group's offsets on `topic` to the first message stored at or after the
        time; online consumers are told to start there. Rows: brokerName, queueId, offset."""
        validate_group(group)
        brokers = await self._route_brokers(topic)
        fields = ResetOffsetRequestHeader(group, topic, timestamp_ms).fields()
        masters = await self.masters()
        rows = []
        for broker in brokers:
            if broker not in masters:
                raise MQClientError(f"broker {broker} has no master: offsets live there")
            data = await self.api.broker_json(
                masters[broker], RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, fields
            )
            rows += data.get("offsetTable", [])
        return sorted(rows, key=lambda r: (r["brokerName"], r["queueId"]))

    # -- messages ---------------------------------------------------------------------------
    async def view_by_offset_id(self, offset_msg_id: str) -> ReceivedMessage:
        """A message by its offset id (store host + CommitLog offset)."""
        try:
            (host, port), phys = decode_offset_msg_id(offset_msg_id)
        except ValueError as e:
            raise MQClientError(f"{offset_msg_id!r} is not a message id: {e}") from None
        if not 0 < port < 65536 or phys < 0:
            raise MQClientError(f"{offset_msg_id} is not an offset message id (give the topic?)")
        addr = f"{host}:{port}"
        cmd = request(RequestCode.VIEW_MESSAGE_BY_ID, ViewMessageRequestHeader(phys).fields())
        try:
            resp = self.api.check(await self.api.invoke(addr, cmd), addr)
        except RemotingError as e:
            raise MQClientError(f"broker {addr} of offset id {offset_msg_id}: {e}") from e
        if self._broker_of(addr) == addr:
            await self.masters()  # learn which broker group owns that address
        msgs = decode_messages(resp.body, self._broker_of(addr))
        if not msgs:
            raise MQClientError(f"no message at {offset_msg_id}")
        return msgs[0]

    def _broker_of(self, addr: str) -> str:
        for name, addrs in self.instance.brokers.items():
            if addr in addrs.values():
                return name
        return addr

    async def query_by_key(
        self, topic: str, key: str, max_num: int = 32, begin_ms: int = 0, end_ms: int = 2**62
    ) -> list[ReceivedMessage]:
        """Messages of `topic` whose KEYS (or UNIQ_KEY) include `key`, from every broker."""
        brokers = await self._route_brokers(topic)
        fields = QueryMessageRequestHeader(topic, key, max_num, begin_ms, end_ms).fields()

        async def one(broker: str) -> list[ReceivedMessage]:
            async def call(addr: str) -> list[ReceivedMessage]:
                resp = await self.api.invoke(addr, request(RequestCode.QUERY_MESSAGE, fields))
                if resp.code == ResponseCode.QUERY_NOT_FOUND:
                    return []
                return decode_messages(self.api.check(resp, addr).body, broker)

            return await self.instance.on_node(broker, call)

        found = [m for ms in await asyncio.gather(*(one(b) for b in brokers)) for m in ms]
        return sorted(found, key=lambda m: (m.store_timestamp, m.broker, m.queue_offset))

    async def query_by_id(self, msg_id: str, topic: str | None = None) -> list[ReceivedMessage]:
        """By UNIQ_KEY within `topic` when given, else (or when not found) by offset id."""
        if topic is not None:
            found = [m for m in await self.query_by_key(topic, msg_id) if m.msg_id == msg_id]
            if found:
                return found
        return [await self.view_by_offset_id(msg_id)]
