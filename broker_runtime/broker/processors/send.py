"""SEND_MESSAGE, SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE (RocketMQ's SendMessageProcessor)."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from broker_runtime.broker.processors.send_back import ensure_retry_topic, route_retry_send
from broker_runtime.broker.transactions import half_message, is_half_send
from broker_runtime.common.delay import DelayLevelError, delay_level_of
from broker_runtime.common.message import (
    CLUSTER,
    WAIT,
    Message,
    offset_msg_id,
    string_to_properties,
)
from broker_runtime.common.topics import (
    SCHEDULE_TOPIC,
    group_of,
    is_retry_topic,
    validate_group,
    validate_topic,
)
from broker_runtime.remoting.bodies import decode_batch
from broker_runtime.remoting.command import RemotingCommand, response_to
from broker_runtime.remoting.connection import Connection
from broker_runtime.remoting.headers import SendMessageRequestHeader, SendMessageResponseHeader
from broker_runtime.remoting.protocol import RequestCode, ResponseCode
from broker_runtime.store.message_store import FlushTimeout, StoreUnavailable
from broker_runtime.store.record_codec import MessageRejected

if TYPE_CHECKING:
    from broker_runtime.broker.controller import BrokerController


def peer_host(conn: Connection) -> tuple[str, int]:
    """The client's address as BORNHOST (IPv4 loopback when it is anything else)."""
    addr = conn.peer_addr
    return addr if addr is not None and addr[0].count(".") == 3 else ("127.0.0.1", 0)


def _delayed(props: dict[str, str]) -> bool:
    try:
        return delay_level_of(props) > 0
    except DelayLevelError:
        return False  # the put refuses it


class SendProcessor:
    MAX_KNOWN_NAMES = 10_000  # a client making up names must not grow the cache for ever

    def __init__(self, ctl: BrokerController) -> None:
        self.ctl = ctl
        self._topics: set[str] = set()  # names that passed validation: checked once each
        self._groups: set[str] = set()
        # offset_msg_id's first half (the store host) is the same for every message here.
        self._host_hex = offset_msg_id(ctl.config.store.store_host, 0)[:16]
        self._cluster = ctl.config.cluster_name

    def _check_names(self, topic: str, group: str) -> None:
        for name, known, validate in (
            (topic, self._topics, validate_topic),
            (group, self._groups, validate_group),
        ):
            if name not in known:
                validate(name)
                if len(known) >= self.MAX_KNOWN_NAMES:
                    known.clear()
                known.add(name)

    async def send(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        ctl = self.ctl
        h = SendMessageRequestHeader.of(cmd)
        if not ctl.is_master:
            return response_to(
                cmd,
                ResponseCode.SERVICE_NOT_AVAILABLE,
                "this broker is a slave: send to its master",
            )
        if h.topic not in self._topics or h.producer_group not in self._groups:
            self._check_names(h.topic, h.producer_group)
        if h.topic == SCHEDULE_TOPIC:
            return response_to(
                cmd,
                ResponseCode.NO_PERMISSION,
                f"{SCHEDULE_TOPIC} is the broker's own: delay a message with the DELAY property",
            )
        retry_group = group_of(h.topic) if is_retry_topic(h.topic) else None
        if retry_group and ctl.topics.get(h.topic) is None:
            group = ctl.groups.find(validate_group(retry_group))
            if group is not None:  # a retry topic has the group's retryQueueNums queues
                ensure_retry_topic(ctl, group)
        cfg = ctl.topic_for_send(h.topic, h.default_topic_queue_nums)
        if cfg is None:
            return response_to(
                cmd,
                ResponseCode.TOPIC_NOT_EXIST,
                f"topic {h.topic} does not exist, create it first",
            )
        if not cfg.writable:
            return response_to(cmd, ResponseCode.NO_PERMISSION, f"topic {h.topic} is not writable")
        queue_id = h.queue_id if h.queue_id >= 0 else random.randrange(cfg.write_queue_nums)
        if queue_id >= max(cfg.write_queue_nums, cfg.read_queue_nums):
            return response_to(
                cmd,
                ResponseCode.SYSTEM_ERROR,
                f"request queueId[{queue_id}] is illegal, topic {h.topic} has "
                f"{cfg.write_queue_nums} write queues",
            )
        born_host = peer_host(conn)
        # As RocketMQ stores them: every message names its cluster; a single message's WAIT is
        # dropped unless it is delayed or a transaction's half message (CommitLog, and the
        # half's parsing, rewrite their properties from the map that still has it), a batch's
        # own properties (WAIT among them) are appended to each message's.
        stamp = string_to_properties(h.properties)
        if cmd.code == RequestCode.SEND_BATCH_MESSAGE or h.batch:
            limit = ctl.config.store.max_message_size
            if len(cmd.body) > limit:  # as RocketMQ's store checks a batch: whole, not each
                return response_to(
                    cmd,
                    ResponseCode.MESSAGE_ILLEGAL,
                    f"the batch is {len(cmd.body)} bytes, maxMessageSize is {limit}",
                )
            stamp[CLUSTER] = self._cluster
            items = [(body, props | stamp, flag) for body, props, flag in decode_batch(cmd.body)]
            if not items:
                return response_to(cmd, ResponseCode.MESSAGE_ILLEGAL, "the batch is empty")
        else:
            if not _delayed(stamp) and not is_half_send(stamp):
                stamp.pop(WAIT, None)
            stamp[CLUSTER] = self._cluster
            items = [(cmd.body, stamp, h.flag)]
        msgs = [
            Message(
                topic=h.topic,
                body=body,
                properties=props,
                queue_id=queue_id,
                flag=flag,
                sys_flag=h.sys_flag,
                born_timestamp=h.born_timestamp,
                born_host=born_host,
                reconsume_times=h.reconsume_times,
            )
            for body, props, flag in items
        ]
        if len(msgs) == 1 and is_half_send(msgs[0].properties) and not h.reconsume_times:
            msgs = [half_message(msgs[0])]  # parked until its transaction ends
        if retry_group:
            refused = route_retry_send(ctl, cmd, h, msgs)
            if refused is not None:
                return refused
        try:
            results = await ctl.put(msgs)
        except (MessageRejected, DelayLevelError) as e:
            return response_to(cmd, ResponseCode.MESSAGE_ILLEGAL, str(e))
        except StoreUnavailable as e:
            return response_to(cmd, ResponseCode.SERVICE_NOT_AVAILABLE, str(e))
        except FlushTimeout as e:
            return response_to(cmd, ResponseCode.FLUSH_DISK_TIMEOUT, str(e))
        last = results[-1]
        code, remark = await ctl.replicate(last.phys_offset + last.size)
        host = self._host_hex
        out = SendMessageResponseHeader(
            msg_id=",".join([f"{host}{r.phys_offset:016X}" for r in results]),
            queue_id=queue_id,
            queue_offset=results[0].queue_offset,
            phys_offset=results[0].phys_offset,
            batch_count=len(results),
        )
        return response_to(cmd, code, remark, fields=out.fields())
