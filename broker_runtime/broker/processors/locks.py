"""LOCK_BATCH_MQ / UNLOCK_BATCH_MQ (RocketMQ's AdminBrokerProcessor.lockBatchMQ/unlockBatchMQ).

Body of both: {"consumerGroup", "clientId", "mqSet": [{"topic", "brokerName", "queueId"}]};
a lock answers {"lockOKMQSet": [...]}, the queues the client holds now (taken or renewed),
an unlock answers SUCCESS with no body. Locks live on the master of the queue's broker.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from broker_runtime.broker.rebalance_lock import MessageQueue
from broker_runtime.common.topics import validate_group, validate_topic
from broker_runtime.remoting.bodies import LockBatchRequestBody, encode_lock_ok
from broker_runtime.remoting.command import RemotingCommand, response_to
from broker_runtime.remoting.connection import Connection
from broker_runtime.remoting.protocol import ResponseCode

if TYPE_CHECKING:
    from broker_runtime.broker.controller import BrokerController

log = logging.getLogger(__name__)
R = ResponseCode


def _request(cmd: RemotingCommand) -> tuple[LockBatchRequestBody, list[MessageQueue]]:
    body = LockBatchRequestBody.decode(cmd.body)
    validate_group(body.consumer_group)
    mqs = [MessageQueue(validate_topic(t), b, q) for t, b, q in body.mq_set]
    return body, mqs


class LockProcessor:
    def __init__(self, ctl: BrokerController) -> None:
        self.ctl = ctl

    async def lock_batch(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        if not self.ctl.is_master:
            return response_to(cmd, R.SERVICE_NOT_AVAILABLE, "queue locks live on the master")
        body, mqs = _request(cmd)
        now = self.ctl.clock.now_ms()
        locked = self.ctl.order_locks.try_lock_batch(body.consumer_group, mqs, body.client_id, now)
        if len(locked) < len(mqs):
            log.info("group %s: client %s locked %d of %d queues", body.consumer_group,
                     body.client_id, len(locked), len(mqs))  # fmt: skip
        return response_to(cmd, R.SUCCESS, body=encode_lock_ok(list(locked)))

    async def unlock_batch(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        if not self.ctl.is_master:
            return response_to(cmd, R.SERVICE_NOT_AVAILABLE, "queue locks live on the master")
        body, mqs = _request(cmd)
        released = self.ctl.order_locks.unlock_batch(body.consumer_group, mqs, body.client_id)
        log.info("group %s: client %s unlocked %d of %d queues", body.consumer_group,
                 body.client_id, released, len(mqs))  # fmt: skip
        return response_to(cmd, R.SUCCESS)
