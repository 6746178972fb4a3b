"""A slave copies its master's topics, groups, consumer and delay offsets (SlaveSynchronize).

The master's tables win: offsets committed to the slave while the master was down are
overwritten by the master's once it is back, as in RocketMQ (a source of re-delivery).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from broker_runtime.broker.subscription_groups import SubscriptionGroupManager
from broker_runtime.broker.topic_config import TopicConfigManager
from broker_runtime.offsets.consumer_offsets import TOPIC_GROUP_SEPARATOR
from broker_runtime.offsets.delay_offsets import read_delay_offsets, write_delay_offsets
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


def _sync_delay_offsets(ctl: BrokerController, raw: object) -> None:
    """The master's delayOffset.json, kept in the slave's config/ too (syncDelayOffset)."""
    if not isinstance(raw, dict):
        raise BodyError("delay offsetTable is not an object")
    try:
        table = {int(level): int(offset) for level, offset in raw.items()}
    except (TypeError, ValueError) as e:
        raise BodyError(f"delay offsetTable has a bad entry: {e}") from None
    store_dir = ctl.config.store.store_dir
    if table and table != read_delay_offsets(store_dir):
        write_delay_offsets(store_dir, table)


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
    delay = decode_json((await _get(ctl, addr, RequestCode.GET_ALL_DELAY_OFFSET)).body, "delay")
    _sync_delay_offsets(ctl, delay.get("offsetTable", {}))
    log.debug("synced %d topics, %d offset keys from %s", len(topics), len(table), addr)
