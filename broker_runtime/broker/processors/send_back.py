"""Consume retry on the broker: CONSUMER_SEND_MSG_BACK, and sends to a `%RETRY%` topic.

As RocketMQ 4.x SendMessageProcessor.consumerSendMsgBack: the broker reads the failed
message back by its CommitLog offset and stores a copy (reconsumeTimes + 1, lineage in
RETRY_TOPIC / ORIGIN_MESSAGE_ID, every other property kept) in `%RETRY%{group}` with delay
level 3 + reconsumeTimes, or in `%DLQ%{group}` once reconsumeTimes reaches the request's
maxReconsumeTimes (`retry_policy.decide_send_back`). The retry topic is readable and routed
like any topic; the DLQ is write-only (PERM_WRITE), so pulls of it are refused, while
queries by key or id and the store's files still show its messages.

A client whose send-back failed sends the copy itself to `%RETRY%{group}` with properties
RECONSUME_TIME / MAX_RECONSUME_TIMES (or the send header's reconsumeTimes /
maxReconsumeTimes): handleRetryAndDLQ routes such a send to the DLQ past the limit too.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from typing import TYPE_CHECKING

from broker_runtime.broker.retry_policy import (
    DLQ_QUEUE_NUMS,
    SendBackTarget,
    decide_send_back,
    send_back_message,
)
from broker_runtime.broker.subscription_groups import SubscriptionGroupConfig
from broker_runtime.broker.topic_config import PERM_RW, TopicConfig
from broker_runtime.common.message import DELAY, MAX_RECONSUME_TIMES, RECONSUME_TIME, Message
from broker_runtime.common.topics import dlq_topic, group_of, retry_topic, validate_group
from broker_runtime.remoting.bodies import PERM_WRITE
from broker_runtime.remoting.command import RemotingCommand, response_to
from broker_runtime.remoting.connection import Connection
from broker_runtime.remoting.headers import (
    ConsumerSendMsgBackRequestHeader,
    SendMessageRequestHeader,
)
from broker_runtime.remoting.protocol import ResponseCode
from broker_runtime.store.message_store import FlushTimeout, StoreUnavailable
from broker_runtime.store.record_codec import MessageRejected

if TYPE_CHECKING:
    from broker_runtime.broker.controller import BrokerController

log = logging.getLogger(__name__)
R = ResponseCode


def ensure_retry_topic(ctl: BrokerController, group: SubscriptionGroupConfig) -> TopicConfig:
    """`%RETRY%{group}`: retryQueueNums queues, readable and writable, routed."""
    return ctl.ensure_topic(retry_topic(group.group_name), group.retry_queue_nums, PERM_RW)


def ensure_dlq_topic(ctl: BrokerController, group: str) -> TopicConfig:
    """`%DLQ%{group}`: one write-only queue (RocketMQ 4.x), so no consumer pulls it."""
    return ctl.ensure_topic(dlq_topic(group), DLQ_QUEUE_NUMS, PERM_WRITE)


def _int_property(msg: Message, name: str) -> int | None:
    raw = msg.properties.pop(name, None)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"property {name} is {raw!r}, not a number") from None


def route_retry_send(
    ctl: BrokerController, cmd: RemotingCommand, h: SendMessageRequestHeader, msgs: list[Message]
) -> RemotingCommand | None:
    """A send to `%RETRY%{group}` (handleRetryAndDLQ): to the DLQ past maxReconsumeTimes.

    Rewrites `msgs` in place; returns an error response if the send must be refused.
    """
    group_name = group_of(h.topic)
    group = ctl.groups.find(validate_group(group_name)) if group_name else None
    if group is None:
        return response_to(
            cmd, R.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group {group_name} does not exist"
        )
    for i, msg in enumerate(msgs):
        # RocketMQ's producer moves these properties into the header; either is honoured,
        # and they are not stored (the count is the unit's RECONSUMETIMES field).
        times = _int_property(msg, RECONSUME_TIME)
        max_times = _int_property(msg, MAX_RECONSUME_TIMES)
        reconsume = times if times is not None else h.reconsume_times
        limit = next(
            v for v in (max_times, h.max_reconsume_times, group.retry_max_times) if v is not None
        )
        msg.reconsume_times = reconsume
        if reconsume >= limit:
            cfg = ensure_dlq_topic(ctl, group.group_name)
            msg.properties.pop(DELAY, None)  # a dead letter is not scheduled
            msgs[i] = dataclasses.replace(
                msg, topic=cfg.topic_name, queue_id=random.randrange(cfg.write_queue_nums)
            )
            log.info("retry send of %s: reconsumed %d of %d times, to %s",
                     msg.uniq_key, reconsume, limit, cfg.topic_name)  # fmt: skip
    return None


class SendBackProcessor:
    def __init__(self, ctl: BrokerController) -> None:
        self.ctl = ctl

    async def send_back(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        ctl = self.ctl
        h = ConsumerSendMsgBackRequestHeader.decode(cmd)
        if not ctl.is_master:
            return response_to(
                cmd, R.SERVICE_NOT_AVAILABLE, "this broker is a slave: send back to its master"
            )
        group = ctl.groups.find(validate_group(h.group))
        if group is None:
            return response_to(
                cmd, R.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group {h.group} does not exist"
            )
        if group.retry_queue_nums <= 0:
            # RocketMQ answers SUCCESS and drops the message; say so instead of keeping quiet.
            log.warning("group %s has no retry queues: message at %d not retried", h.group,
                        h.offset)  # fmt: skip
            return response_to(
                cmd, R.SUCCESS, f"group {h.group} has retryQueueNums 0: the message is dropped"
            )
        retry_cfg = ensure_retry_topic(ctl, group)
        if not retry_cfg.writable:
            return response_to(
                cmd, R.NO_PERMISSION, f"the topic {retry_cfg.topic_name} may not be written"
            )
        failed = ctl.require_store().message_at(h.offset)
        if failed is None:
            return response_to(cmd, R.SYSTEM_ERROR, f"look message by offset failed, {h.offset}")
        limit = h.max_reconsume_times
        if "maxReconsumeTimes" not in cmd.ext_fields:
            limit = group.retry_max_times
        decision = decide_send_back(
            h.group, failed.reconsume_times, limit, h.delay_level, ctl.delay_levels.max_level
        )
        if decision.target is SendBackTarget.DLQ:
            target = ensure_dlq_topic(ctl, h.group)
        else:
            target = retry_cfg
        msg = send_back_message(failed, decision)
        msg.queue_id = random.randrange(target.write_queue_nums)
        try:
            results = await ctl.put([msg])
        except MessageRejected as e:
            return response_to(cmd, R.MESSAGE_ILLEGAL, str(e))
        except StoreUnavailable as e:
            return response_to(cmd, R.SERVICE_NOT_AVAILABLE, str(e))
        except FlushTimeout as e:
            return response_to(cmd, R.FLUSH_DISK_TIMEOUT, str(e))
        last = results[-1]
        code, remark = await ctl.replicate(last.phys_offset + last.size)
        log.debug("sent back %s of %s (reconsume %d) to %s", failed.uniq_key, h.group,
                  failed.reconsume_times, target.topic_name)  # fmt: skip
        return response_to(cmd, code, remark)
