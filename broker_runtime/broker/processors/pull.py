"""PULL_MESSAGE with long polling (RocketMQ's PullMessageProcessor + PullRequestHoldService).

A pull that finds nothing new is held until a message arrives for its queue or its suspend
timeout passes; a pull whose tag filter skipped everything it looked at keeps looking (from
the advanced offset) while its time lasts. The response body is the matching CommitLog
units back to back.
"""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING

from broker_runtime.broker.message_filter import Subscription, parse_subscription
from broker_runtime.broker.processors.pull_access import PullGate, pull_gate
from broker_runtime.broker.pull_reader import GetResult, GetStatus, read_queue
from broker_runtime.broker.subscription_groups import SubscriptionGroupConfig
from broker_runtime.common.constants import SQL92
from broker_runtime.common.sql_filter import SqlFilterError
from broker_runtime.common.topics import validate_group, validate_topic
from broker_runtime.remoting.bodies import MASTER_ID
from broker_runtime.remoting.command import RemotingCommand, response_to
from broker_runtime.remoting.connection import Connection
from broker_runtime.remoting.headers import PullMessageRequestHeader, PullMessageResponseHeader
from broker_runtime.remoting.protocol import FLAG_COMMIT_OFFSET, FLAG_SUBSCRIPTION, ResponseCode
from broker_runtime.store.message_store import MessageStore

if TYPE_CHECKING:
    from broker_runtime.broker.controller import BrokerController

R = ResponseCode
_HOLDABLE = (GetStatus.OFFSET_OVERFLOW_ONE, GetStatus.NO_MESSAGE_IN_QUEUE, GetStatus.NO_MATCHED_MSG)
DAMAGED_RECHECK_S = 1.0  # a pull held at a damaged unit looks for an operator's skip this often


def response_code(result: GetResult, request_offset: int) -> int:
    s = result.status
    if s is GetStatus.FOUND:
        return R.SUCCESS
    if s in (GetStatus.MESSAGE_WAS_REMOVING, GetStatus.NO_MATCHED_MSG):
        return R.PULL_RETRY_IMMEDIATELY
    if s is GetStatus.NO_MESSAGE_IN_QUEUE:
        return R.PULL_OFFSET_MOVED if request_offset != 0 else R.PULL_NOT_FOUND
    if s in (GetStatus.OFFSET_OVERFLOW_ONE, GetStatus.DAMAGED_UNIT):
        return R.PULL_NOT_FOUND
    return R.PULL_OFFSET_MOVED  # OFFSET_TOO_SMALL, OFFSET_OVERFLOW_BADLY


def _arrived(store: MessageStore, key: tuple[str, int], offset: int) -> bool:
    return store.max_offset(*key) > offset


def _no_messages(
    cmd: RemotingCommand, store: MessageStore, h: PullMessageRequestHeader, next_offset: int,
    remark: str,
) -> RemotingCommand:  # fmt: skip
    """PULL_NOT_FOUND without messages (the queue access lock's answers)."""
    out = PullMessageResponseHeader(
        next_begin_offset=next_offset,
        min_offset=store.min_offset(h.topic, h.queue_id),
        max_offset=store.max_offset(h.topic, h.queue_id),
        suggest_which_broker_id=MASTER_ID,
    )
    return response_to(cmd, R.PULL_NOT_FOUND, remark, fields=out.fields())


class PullProcessor:
    def __init__(self, ctl: BrokerController) -> None:
        self.ctl = ctl

    async def pull(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        ctl = self.ctl
        cfg = ctl.config
        h = PullMessageRequestHeader.decode(cmd)
        validate_topic(h.topic)
        validate_group(h.consumer_group)
        group = ctl.groups.find(h.consumer_group)
        if group is None:
            return response_to(
                cmd,
                R.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group {h.consumer_group} does not exist",
            )
        if not group.consume_enable:
            return response_to(cmd, R.NO_PERMISSION, f"group {h.consumer_group} may not consume")
        topic = ctl.topic_for_read(h.topic, h.queue_id)
        if topic is None:
            return response_to(cmd, R.TOPIC_NOT_EXIST, f"topic {h.topic} does not exist")
        if not topic.readable:
            return response_to(cmd, R.NO_PERMISSION, f"topic {h.topic} may not be pulled")
        if not 0 <= h.queue_id < topic.read_queue_nums:
            return response_to(
                cmd,
                R.SYSTEM_ERROR,
                f"queueId[{h.queue_id}] is illegal, topic {h.topic} has "
                f"{topic.read_queue_nums} read queues",
            )
        if h.max_msg_nums <= 0:
            return response_to(cmd, R.SYSTEM_ERROR, f"maxMsgNums {h.max_msg_nums} must be positive")
        if ctl.is_master and h.sys_flag & FLAG_COMMIT_OFFSET and h.commit_offset >= 0:
            # Only with the flag (a broadcasting Java consumer sends commitOffset=0 without it).
            # On arrival, as RocketMQ (only the first, suspendable pass stores it): committed
            # after a long hold it would overwrite a newer UPDATE_CONSUMER_OFFSET.
            ctl.offsets.commit(h.topic, h.consumer_group, h.queue_id, h.commit_offset)
        flt = self._subscription(cmd, h)
        if isinstance(flt, RemotingCommand):
            return flt
        store = ctl.require_store()
        suspend_ms = min(max(0, h.suspend_timeout_millis), cfg.max_suspend_ms)
        gate = pull_gate(ctl, h, conn)
        if gate is None:
            return (await self._read(cmd, conn, h, group, flt, suspend_ms, None))[0]
        access = await gate.admit(suspend_ms / 1000)
        if not access.allowed:
            return _no_messages(cmd, store, h, h.queue_offset, access.reason)
        committed = gate.committed()
        if access.acquired and committed > h.queue_offset:
            # DeFiBus's correctRequestOffset: what the old holder acked is not pulled again.
            remark = f"lock a queue success, update pull offset ({access.reason})"
            return _no_messages(cmd, store, h, committed, remark)
        gate.started()
        delivered: int | None = None
        try:
            resp, delivered = await self._read(cmd, conn, h, group, flt, suspend_ms, gate)
            return resp
        finally:
            gate.ended(delivered)

    def _subscription(
        self, cmd: RemotingCommand, h: PullMessageRequestHeader
    ) -> Subscription | RemotingCommand:
        """The pull's own subscription (FLAG_SUBSCRIPTION), else the one the group's
        heartbeat registered for the topic, as RocketMQ's PullMessageProcessor; or the
        refusal to answer with."""
        if h.sys_flag & FLAG_SUBSCRIPTION or h.subscription is not None:
            expression, kind = h.subscription, h.expression_type
        else:
            info = self.ctl.consumers.groups.get(h.consumer_group)
            sub = info.subscriptions.get(h.topic) if info is not None else None
            if sub is None:
                remark = f"the consumer's subscription not exist, group: {h.consumer_group}"
                return response_to(cmd, R.SUBSCRIPTION_NOT_EXIST, remark)
            expression, kind = sub.sub_string, sub.expression_type
        return subscription_or_refusal(self.ctl, cmd, expression, kind)

    async def _read(
        self,
        cmd: RemotingCommand,
        conn: Connection,
        h: PullMessageRequestHeader,
        group: SubscriptionGroupConfig,
        flt: Subscription,
        suspend_ms: int,
        gate: PullGate | None,
    ) -> tuple[RemotingCommand, int | None]:
        """Read the queue, holding the pull while there is nothing to read and time left.

        Also returns the next offset when messages were found (what was delivered).
        """
        ctl = self.ctl
        cfg = ctl.config
        store = ctl.require_store()
        key = (h.topic, h.queue_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + suspend_ms / 1000
        offset = h.queue_offset
        while True:
            result = read_queue(
                store,
                h.topic,
                h.queue_id,
                offset,
                h.max_msg_nums,
                flt,
                max_bytes=cfg.max_pull_bytes,
                correct_offset=ctl.is_master,
                slave_lag_bytes=cfg.suggest_slave_lag_bytes,
                damaged=ctl.damaged,
            )
            left = deadline - loop.time()
            if result.status is GetStatus.DAMAGED_UNIT and left > 0 and not conn.closed:
                await asyncio.sleep(min(left, DAMAGED_RECHECK_S))  # held: no busy re-pulls
                continue
            if result.status not in _HOLDABLE or left <= 0 or ctl.hold is None or conn.closed:
                break
            if result.status is GetStatus.NO_MATCHED_MSG:
                offset = result.next_begin_offset  # nothing matched so far: look on from there
                if store.max_offset(*key) > offset:
                    continue
            wait = left if cfg.long_polling else min(left, cfg.short_polling_ms / 1000)
            await ctl.hold.hold(key, wait, functools.partial(_arrived, store, key, offset))
            if gate is not None and not gate.holds():  # taken over while this pull waited
                remark = "queue taken by another client"
                return _no_messages(cmd, store, h, h.queue_offset, remark), None
        code = response_code(result, h.queue_offset)
        suggest = MASTER_ID
        if cfg.slave_read_enable and gate is None:  # the access lock lives on the master
            suggest = (
                group.which_broker_when_consume_slowly if result.suggest_slave else group.broker_id
            )
        body = b"".join(result.units)
        if not ctl.is_master:
            if not cfg.slave_read_enable:
                code, suggest, body = R.PULL_RETRY_IMMEDIATELY, MASTER_ID, b""
            elif code == R.PULL_OFFSET_MOVED:  # a slave may just be behind: no correction
                code, suggest = R.PULL_RETRY_IMMEDIATELY, group.broker_id
        out = PullMessageResponseHeader(
            next_begin_offset=result.next_begin_offset,
            min_offset=result.min_offset,
            max_offset=result.max_offset,
            suggest_which_broker_id=suggest,
        )
        delivered = result.next_begin_offset if body else None
        if body:
            ctl.stats.on_got(len(result.units))
        return response_to(cmd, code, None, fields=out.fields(), body=body), delivered


def subscription_or_refusal(
    ctl: BrokerController, cmd: RemotingCommand, expression: str | None, kind: str | None
) -> Subscription | RemotingCommand:
    """A compiled subscription, or the answer RocketMQ gives: SQL92 while the broker's
    enable_property_filter is off, or an expression that does not compile."""
    if kind == SQL92 and not ctl.config.enable_property_filter:
        remark = f"The broker does not support consumer to filter message by {kind}"
        return response_to(cmd, R.SYSTEM_ERROR, remark)
    try:
        return parse_subscription(expression, kind)
    except (SqlFilterError, ValueError) as exc:
        return response_to(cmd, R.SUBSCRIPTION_PARSE_FAILED, f"subscription is illegal: {exc}")
