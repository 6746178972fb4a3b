"""A slave copies its master's topics, groups and consumer offsets (SlaveSynchronize).

The master's tables win: offsets committed to the slave while the master was down are
overwritten by the master's once it is back, as in RocketMQ (a source of re-delivery).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from broker_runtime.broker.subscription_groups import SubscriptionGroupManager
from broker_runtime.broker.topic_config import TopicConfigManager
from broker_runtime.offsets.consumer_offsets import TOPIC_GROUP_SEPARATOR
from broker_runtime.remoting.bodies import BodyError, decode_json
from broker_runtime.remoting.command import RemotingCommand, request
from broker_runtime.remoting.protocol import RequestCode, ResponseCode

if TYPE_CHECKING:
    from broker_runtime.broker.controller import BrokerController

log = logging.getLogger(__name__)


async def _get(ctl: BrokerController, addr: str, code: int) -> RemotingCommand:
    resp = await ctl.call(addr, request(code))
    if resp.code != ResponseCode.SUCCESS:
        raise BodyError(f"master answered {resp.code}: {resp.remark}")
    return resp


async def sync_from_master(ctl: BrokerController, addr: str) -> None:
    topics = decode_json((await _get(ctl, addr, RequestCode.GET_ALL_TOPIC_CONFIG)).body, "topics")
    ctl.topics.replace_all(TopicConfigManager.parse_table(topics.get("topicConfigTable", {})))
    groups = decode_json(
        (await _get(ctl, addr, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)).body, "groups"
    )
    ctl.groups.replace_all(
        SubscriptionGroupManager.parse_table(groups.get("subscriptionGroupTable", {}))
    )
    offsets = decode_json(
        (await _get(ctl, addr, RequestCode.GET_ALL_CONSUMER_OFFSET)).body, "offsets"
    )
    table = offsets.get("offsetTable", {})
    if not isinstance(table, dict):
        raise BodyError("offsetTable is not an object")
    for key, queues in table.items():
        topic, _, group = str(key).partition(TOPIC_GROUP_SEPARATOR)
        for qid, offset in dict(queues).items():
            ctl.offsets.commit(topic, group, int(qid), int(offset))
    ctl.offsets.persist()
    log.debug("synced %d topics, %d offset keys from %s", len(topics), len(table), addr)
