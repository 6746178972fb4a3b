"""Topic/group management, statistics, offset reset, offset and message queries."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from broker_runtime.broker.processors.consumer import R
from broker_runtime.broker.stats import rocketmq_runtime_info
from broker_runtime.broker.subscription_groups import SubscriptionGroupConfig
from broker_runtime.broker.topic_config import TopicConfig
from broker_runtime.common.fastjson import dumps_queue_table
from broker_runtime.common.topics import validate_group, validate_topic
from broker_runtime.offsets.consumer_offsets import TOPIC_GROUP_SEPARATOR
from broker_runtime.offsets.delay_offsets import read_delay_offsets
from broker_runtime.remoting.bodies import decode_json, encode_json
from broker_runtime.remoting.command import FLAG_ONEWAY, RemotingCommand, request, response_to
from broker_runtime.remoting.connection import Connection, RemotingError
from broker_runtime.remoting.headers import (
    CreateTopicRequestHeader,
    OffsetResponseHeader,
    QueryMessageRequestHeader,
    QueryMessageResponseHeader,
    ResetOffsetRequestHeader,
    TopicHeader,
    TopicQueueHeader,
    ViewMessageRequestHeader,
)
from broker_runtime.remoting.protocol import RequestCode

if TYPE_CHECKING:
    from broker_runtime.broker.controller import BrokerController

log = logging.getLogger(__name__)


class AdminProcessor:
    def __init__(self, ctl: BrokerController) -> None:
        self.ctl = ctl

    async def create_topic(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        h = CreateTopicRequestHeader.decode(cmd)
        if not self.ctl.is_master:
            return response_to(cmd, R.SERVICE_NOT_AVAILABLE, "create topics on the master")
        self.ctl.topics.put(TopicConfig(h.topic, h.read_queue_nums, h.write_queue_nums, h.perm))
        self.ctl.register_soon()
        log.info(
            "topic %s created/updated: %d/%d queues", h.topic, h.read_queue_nums, h.write_queue_nums
        )
        return response_to(cmd, R.SUCCESS)

    async def all_topics(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        return response_to(cmd, R.SUCCESS, body=encode_json(self.ctl.topics.to_json()))

    async def create_group(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        cfg = SubscriptionGroupConfig.from_json(decode_json(cmd.body, "subscription group"))
        self.ctl.groups.put(cfg)
        return response_to(cmd, R.SUCCESS)

    async def all_groups(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        return response_to(cmd, R.SUCCESS, body=encode_json(self.ctl.groups.to_json()))

    async def all_delay_offsets(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """GET_ALL_DELAY_OFFSET: delayOffset.json's shape, {"offsetTable": {"1": n, ...}}."""
        ctl = self.ctl
        if ctl.schedule is not None:
            table = ctl.schedule.table()
        else:  # a slave: what it last copied from its master
            table = read_delay_offsets(ctl.config.store.store_dir)
        body = {"offsetTable": {str(level): offset for level, offset in sorted(table.items())}}
        return response_to(cmd, R.SUCCESS, body=encode_json(body))

    def _topic_config(self, topic: str | None) -> TopicConfig:
        cfg = self.ctl.topics.get(validate_topic(topic))
        if cfg is None:
            raise LookupError(f"topic {topic} does not exist on {self.ctl.name}")
        return cfg

    async def topic_stats(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """Per queue: min and max offset, time of the last message (mqadmin topicStatus)."""
        try:
            cfg = self._topic_config(TopicHeader.decode(cmd).topic)
        except LookupError as e:
            return response_to(cmd, R.TOPIC_NOT_EXIST, str(e))
        store = self.ctl.require_store()
        rows = []
        for q in range(cfg.write_queue_nums):
            hi = store.max_offset(cfg.topic_name, q)
            rows.append(
                {
                    "topic": cfg.topic_name,
                    "brokerName": self.ctl.config.broker_name,
                    "queueId": q,
                    "minOffset": store.min_offset(cfg.topic_name, q),
                    "maxOffset": hi,
                    "lastUpdateTimestamp": store.store_time_at(cfg.topic_name, q, hi - 1),
                }
            )
        return response_to(cmd, R.SUCCESS, body=dumps_queue_table(rows))

    async def consume_stats(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """Per queue: broker offset, the group's offset, time of its last consumed message."""
        h = TopicHeader.decode(cmd)
        group = validate_group(h.consumer_group)
        if h.topic:
            topics = [validate_topic(h.topic)]
        else:
            topics = sorted(
                {k.partition(TOPIC_GROUP_SEPARATOR)[0] for k in self.ctl.offsets.table()
                 if k.partition(TOPIC_GROUP_SEPARATOR)[2] == group}
            )  # fmt: skip
        store = self.ctl.require_store()
        rows: list[dict[str, Any]] = []
        now = self.ctl.clock.now_ms()
        broker = self.ctl.config.broker_name
        for topic in topics:
            cfg = self.ctl.topics.get(topic)
            if cfg is None:
                continue
            access = self.ctl.access.snapshot(group, topic) if self.ctl.access else {}
            order = self.ctl.order_locks.snapshot(group, topic, broker, now)
            for q in range(cfg.write_queue_nums):
                consumer = self.ctl.offsets.query(topic, group, q)
                row = {
                    "topic": topic,
                    "brokerName": broker,
                    "queueId": q,
                    "brokerOffset": store.max_offset(topic, q),
                    "consumerOffset": consumer,
                    "lastTimestamp": store.store_time_at(topic, q, consumer - 1),
                }
                if q in access:  # the queue access lock's holder (queue_access_lock on)
                    row["accessLock"] = access[q]
                if q in order:  # an orderly consumer's LOCK_BATCH_MQ lock
                    row["orderLock"] = order[q]
                rows.append(row)
        if not rows:
            return response_to(
                cmd,
                R.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"group {group} has no offsets on {self.ctl.name}",
            )
        return response_to(cmd, R.SUCCESS, body=dumps_queue_table(rows, consumeTps=0.0))

    async def reset_offset(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """Set a group's offsets to the first message at or after a time, tell its clients."""
        h = ResetOffsetRequestHeader.decode(cmd)
        try:
            cfg = self._topic_config(h.topic)
        except LookupError as e:
            return response_to(cmd, R.TOPIC_NOT_EXIST, str(e))
        validate_group(h.group)
        store = self.ctl.require_store()
        rows = []
        for q in range(cfg.read_queue_nums):
            offset = store.offset_by_time(h.topic, q, h.timestamp)
            self.ctl.offsets.commit(h.topic, h.group, q, offset)
            rows.append(
                {
                    "topic": h.topic,
                    "brokerName": self.ctl.config.broker_name,
                    "queueId": q,
                    "offset": offset,
                }
            )
        self.ctl.offsets.persist()
        body = dumps_queue_table(rows, scalar=True)  # ResetOffsetBody
        for client in self.ctl.consumers.connections(h.group):
            assert isinstance(client, Connection)
            note = request(
                RequestCode.RESET_CONSUMER_CLIENT_OFFSET,
                {"topic": h.topic, "group": h.group, "timestamp": h.timestamp},
                body,
            )
            note.flag |= FLAG_ONEWAY
            try:
                client.send(note)
            except RemotingError as e:
                log.info("reset notice to %s failed: %s", client.peer, e)
        log.info("group %s offsets on %s reset to time %d: %s", h.group, h.topic, h.timestamp, rows)
        return response_to(cmd, R.SUCCESS, body=body)

    async def runtime_info(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """GET_BROKER_RUNTIME_INFO: a KVTable of strings, RocketMQ's keys and this broker's."""
        ctl = self.ctl
        store = ctl.require_store()
        table: dict[str, Any] = {
            **rocketmq_runtime_info(ctl),
            "brokerName": ctl.config.broker_name,
            "brokerId": ctl.config.broker_id,
            "brokerRole": ctl.role.value,
            "flushDiskType": ctl.config.store.flush.value,
            "commitLogMinOffset": store.log_min_offset,
            "commitLogMaxOffset": store.log_max_offset,
            "dispatchedOffset": store.dispatcher.dispatched_offset,
            "pullsHeld": ctl.hold.waiting if ctl.hold else 0,
            "consumerGroups": len(ctl.consumers.groups),
            "queueAccessLock": ctl.access is not None,
        }
        if ctl.damaged.met:
            table["damagedUnits"] = encode_json(ctl.damaged.status()).decode()
        if ctl.schedule is not None:
            table["scheduleDelivered"] = ctl.schedule.delivered
            table["scheduleSkipped"] = ctl.schedule.skipped
            table["delayOffsets"] = encode_json(ctl.schedule.table()).decode()
        if ctl.access is not None:
            table["accessLockRefusedPulls"] = ctl.access.refused
            table["accessLockTransfers"] = encode_json(ctl.access.transfers).decode()
        if ctl.ha_master is not None:
            table["haPort"] = ctl.ha_master.port
            table["haSlaveAckOffset"] = ctl.ha_master.acked
            table["haConnections"] = len(ctl.ha_master.slaves)
            table["haSlaves"] = encode_json(ctl.ha_master.status()).decode()
        if ctl.ha_slave is not None:
            for k, v in ctl.ha_slave.status().items():
                table[f"ha{k[0].upper()}{k[1:]}"] = v
            table["masterAddr"] = ctl.master_addr
        body = encode_json({"table": {k: "" if v is None else str(v) for k, v in table.items()}})
        return response_to(cmd, R.SUCCESS, body=body)


class QueryProcessor:
    """Offsets of a queue, and messages by id and by key."""

    def __init__(self, ctl: BrokerController) -> None:
        self.ctl = ctl

    def _offset(self, cmd: RemotingCommand, offset: int) -> RemotingCommand:
        return response_to(cmd, R.SUCCESS, fields=OffsetResponseHeader(offset).fields())

    async def max_offset(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        h = TopicQueueHeader.decode(cmd)
        return self._offset(
            cmd, self.ctl.require_store().max_offset(validate_topic(h.topic), h.queue_id)
        )

    async def min_offset(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        h = TopicQueueHeader.decode(cmd)
        return self._offset(
            cmd, self.ctl.require_store().min_offset(validate_topic(h.topic), h.queue_id)
        )

    async def search_offset(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        h = TopicQueueHeader.decode(cmd)
        if h.timestamp is None:
            return response_to(cmd, R.SYSTEM_ERROR, "timestamp is required")
        store = self.ctl.require_store()
        return self._offset(
            cmd, store.offset_by_time(validate_topic(h.topic), h.queue_id, h.timestamp)
        )

    async def earliest_time(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        h = TopicQueueHeader.decode(cmd)
        store = self.ctl.require_store()
        topic = validate_topic(h.topic)
        ts = store.store_time_at(topic, h.queue_id, store.min_offset(topic, h.queue_id))
        return response_to(cmd, R.SUCCESS, fields={"timestamp": ts})

    async def view_message(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """VIEW_MESSAGE_BY_ID: the raw unit at a CommitLog offset (from an offset msg id)."""
        offset = ViewMessageRequestHeader.decode(cmd).offset
        store = self.ctl.require_store()
        m = store.message_at(offset)
        raw = store.unit_at(offset, m.total_size) if m is not None else None
        if raw is None:
            return response_to(cmd, R.SYSTEM_ERROR, f"no message at CommitLog offset {offset}")
        return response_to(cmd, R.SUCCESS, body=raw)

    async def query_message(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """QUERY_MESSAGE: units of messages whose key (or UNIQ_KEY) is `key`, in a time range."""
        h = QueryMessageRequestHeader.decode(cmd)
        store = self.ctl.require_store()
        found = store.query_by_key(
            validate_topic(h.topic), h.key, max(1, h.max_num), h.begin_timestamp, h.end_timestamp
        )
        units = [store.unit_at(m.phys_offset, m.total_size) for m in found]
        body = b"".join(u for u in units if u is not None)
        if not body:
            return response_to(cmd, R.QUERY_NOT_FOUND, f"no message with key {h.key} in {h.topic}")
        last = store.index.files[-1] if store.index is not None and store.index.files else None
        out = QueryMessageResponseHeader(
            last.end_timestamp if last else 0, last.end_phy_offset if last else 0
        )
        return response_to(cmd, R.SUCCESS, fields=out.fields(), body=body)
