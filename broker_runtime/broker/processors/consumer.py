"""Consumer membership and offsets: HEART_BEAT, UNREGISTER_CLIENT, GET_CONSUMER_LIST_BY_GROUP,
QUERY/UPDATE_CONSUMER_OFFSET, GET_ALL_CONSUMER_OFFSET (RocketMQ's ClientManageProcessor and
ConsumerManageProcessor), and NOTIFY_CONSUMER_IDS_CHANGED to a group whose members changed.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from broker_runtime.broker.namesrv_client import register_all
from broker_runtime.broker.processors.send_back import ensure_retry_topic
from broker_runtime.common.topics import validate_group, validate_topic
from broker_runtime.offsets.consumer_offsets import TOPIC_GROUP_SEPARATOR
from broker_runtime.remoting.bodies import HeartbeatData, encode_json
from broker_runtime.remoting.command import FLAG_ONEWAY, RemotingCommand, request, response_to
from broker_runtime.remoting.connection import Connection, RemotingError
from broker_runtime.remoting.headers import (
    OffsetResponseHeader,
    QueueOffsetHeader,
    TopicHeader,
    UnregisterClientRequestHeader,
)
from broker_runtime.remoting.protocol import BROKER_VERSION, RequestCode, ResponseCode

if TYPE_CHECKING:
    from broker_runtime.broker.controller import BrokerController

log = logging.getLogger(__name__)
R = ResponseCode
# MessageStoreConfig.accessMessageInMemoryMaxRatio (40) of the machine's physical memory.
IN_MEMORY_BYTES = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 40 // 100


def notify_ids_changed(ctl: BrokerController, group: str) -> None:
    """Tell every client of `group` to rebalance (oneway, best effort). A group whose last
    client left has its consumer filters marked dead (RocketMQ's UNREGISTER event)."""
    if group not in ctl.consumers.groups:
        ctl.filters.unregister(group, ctl.clock.now_ms())
    cfg = ctl.groups.table.get(group)
    if cfg is not None and not cfg.notify_consumer_ids_changed_enable:
        return
    for conn in ctl.consumers.connections(group):
        assert isinstance(conn, Connection)
        cmd = request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": group})
        cmd.flag |= FLAG_ONEWAY
        try:
            conn.send(cmd)
        except RemotingError as e:
            log.info("notify %s of group %s change failed: %s", conn.peer, group, e)


class ConsumerProcessor:
    def __init__(self, ctl: BrokerController) -> None:
        self.ctl = ctl

    def _watch(self, conn: Connection) -> None:
        """Drop a connection's clients as soon as it closes (ClientHousekeepingService)."""
        if conn in self.ctl._watched:
            return
        self.ctl._watched.add(conn)

        async def watch() -> None:
            await conn.wait_closed()
            self.ctl._watched.discard(conn)
            for group in self.ctl.consumers.connection_closed(conn):
                notify_ids_changed(self.ctl, group)

        self.ctl.spawn(watch())

    async def heartbeat(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        ctl = self.ctl
        hb = HeartbeatData.decode(cmd.body)
        for g in hb.producer_groups:
            ctl.transactions.producer_seen(validate_group(g), hb.client_id, conn)
        for c in hb.consumers:
            validate_group(c.group_name)
            for s in c.subscriptions:
                validate_topic(s.topic)
        topics_before = ctl.topics.version.counter
        for c in hb.consumers:
            group = ctl.groups.find(c.group_name)
            if group is None:
                return response_to(
                    cmd, R.SUBSCRIPTION_GROUP_NOT_EXIST, f"group {c.group_name} does not exist"
                )
            if c.message_model == "CLUSTERING" and ctl.is_master and group.retry_queue_nums > 0:
                ensure_retry_topic(ctl, group)
            now = ctl.clock.now_ms()
            subs = [
                (s.topic, s.sub_string, s.expression_type, s.sub_version) for s in c.subscriptions
            ]
            ctl.filters.register_group(c.group_name, subs, now)  # every heartbeat, as RocketMQ
            if ctl.consumers.register(hb.client_id, conn, c, now, cmd.language, cmd.version):
                log.info("group %s: client %s joined or changed", c.group_name, hb.client_id)
                notify_ids_changed(ctl, c.group_name)
        if hb.consumers:
            self._watch(conn)
        if ctl.topics.version.counter != topics_before:
            # A new retry topic reaches the name servers before the client hears back, as
            # RocketMQ registers it inline: the official client asks for its route right after.
            await register_all(ctl)
        resp = response_to(cmd, R.SUCCESS)
        resp.version = BROKER_VERSION
        return resp

    async def unregister_client(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        h = UnregisterClientRequestHeader.decode(cmd)
        if h.consumer_group and self.ctl.consumers.unregister(h.client_id, h.consumer_group):
            log.info("group %s: client %s left", h.consumer_group, h.client_id)
            notify_ids_changed(self.ctl, h.consumer_group)
        return response_to(cmd, R.SUCCESS)

    async def consumer_list(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        group = TopicHeader.decode(cmd).consumer_group
        if not group:
            return response_to(cmd, R.SYSTEM_ERROR, "consumerGroup is required")
        ids = self.ctl.consumers.client_ids(validate_group(group))
        if not ids:
            return response_to(cmd, R.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return response_to(cmd, R.SUCCESS, body=encode_json({"consumerIdList": ids}))

    async def consumer_connections(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """GET_CONSUMER_CONNECTION_LIST: a group's clients and subscriptions."""
        group = TopicHeader.decode(cmd).consumer_group or ""
        info = self.ctl.consumers.groups.get(group)
        if info is None:
            remark = f"the consumer group[{group}] not online"  # mqadmin prints it
            return response_to(cmd, R.CONSUMER_NOT_ONLINE, remark)
        connections = []
        for ch in info.channels.values():
            assert isinstance(ch.conn, Connection)
            peer = ch.conn.peer_addr
            connections.append(
                {
                    "clientId": ch.client_id,
                    "clientAddr": f"{peer[0]}:{peer[1]}" if peer else "",
                    "language": ch.language,
                    "version": ch.version,
                }
            )
        body = {
            "connectionSet": connections,
            "subscriptionTable": {
                topic: {
                    "topic": topic,
                    "subString": sub.sub_string,
                    "expressionType": sub.expression_type,
                }
                for topic, sub in info.subscriptions.items()
            },
            "consumeType": info.consume_type,
            "messageModel": info.message_model,
            "consumeFromWhere": info.consume_from_where,
        }
        return response_to(cmd, R.SUCCESS, body=encode_json(body))

    async def consumed_by(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """QUERY_TOPIC_CONSUME_BY_WHO: groups subscribed to the topic or with offsets on it."""
        topic = validate_topic(TopicHeader.decode(cmd).topic)
        groups = self.ctl.consumers.groups_of_topic(topic)
        groups |= {
            key.partition(TOPIC_GROUP_SEPARATOR)[2]
            for key in self.ctl.offsets.table()
            if key.partition(TOPIC_GROUP_SEPARATOR)[0] == topic
        }
        return response_to(cmd, R.SUCCESS, body=encode_json({"groupList": sorted(groups)}))

    async def query_offset(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        h = QueueOffsetHeader.decode(cmd)
        offset = self.ctl.offsets.query(h.topic, h.consumer_group, h.queue_id)
        if offset < 0 and not self._starts_in_memory(h.topic, h.queue_id):
            # The client decides from its consume-from-where.
            return response_to(
                cmd, R.QUERY_NOT_FOUND, f"group {h.consumer_group} has no offset for this queue"
            )
        return response_to(cmd, R.SUCCESS, fields=OffsetResponseHeader(max(0, offset)).fields())

    def _starts_in_memory(self, topic: str, queue_id: int) -> bool:
        """RocketMQ's answer to a group's first query (queryConsumerOffset): offset 0 when the
        queue still starts at 0 and that message is not "in disk", past
        accessMessageInMemoryMaxRatio (40 %) of physical memory behind the log's end. So a new
        group reads such a queue from its start whatever its consume-from-where. Taken here
        for the whole log: within 40 % of memory, every first message is in memory."""
        store = self.ctl.require_store()
        if store.min_offset(validate_topic(topic), queue_id) > 0:
            return False
        log = store.commit_log
        return log.max_offset - log.min_offset <= IN_MEMORY_BYTES

    async def update_offset(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        h = QueueOffsetHeader.decode(cmd)
        if h.commit_offset is None:
            return response_to(cmd, R.SYSTEM_ERROR, "commitOffset is required")
        self.ctl.offsets.commit(h.topic, h.consumer_group, h.queue_id, h.commit_offset)
        return response_to(cmd, R.SUCCESS)

    async def all_offsets(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        table = {
            key: {str(q): o for q, o in sorted(queues.items())}
            for key, queues in sorted(self.ctl.offsets.table().items())
        }
        return response_to(cmd, R.SUCCESS, body=encode_json({"offsetTable": table}))
