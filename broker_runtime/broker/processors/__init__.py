"""Request processors of the broker, one module per request family, and their registration.

Every write (send, send-back, the schedule service's puts) stores through
`BrokerController.put` / `replicate`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker_runtime.broker.processors import (
    admin,
    client_config,
    consumer,
    end_transaction,
    locks,
    pull,
    send,
    send_back,
)
from broker_runtime.remoting.protocol import RequestCode as C

if TYPE_CHECKING:
    from broker_runtime.broker.controller import BrokerController


def register_processors(ctl: BrokerController) -> None:
    s = send.SendProcessor(ctl)
    p = pull.PullProcessor(ctl)
    c = consumer.ConsumerProcessor(ctl)
    a = admin.AdminProcessor(ctl)
    q = admin.QueryProcessor(ctl)
    b = send_back.SendBackProcessor(ctl)
    lk = locks.LockProcessor(ctl)
    cc = client_config.ClientConfigProcessor(ctl)
    et = end_transaction.EndTransactionProcessor(ctl)
    for code, fn in (
        (C.SEND_MESSAGE, s.send),
        (C.SEND_MESSAGE_V2, s.send),
        (C.SEND_BATCH_MESSAGE, s.send),
        (C.PULL_MESSAGE, p.pull),
        (C.CONSUMER_SEND_MSG_BACK, b.send_back),
        (C.END_TRANSACTION, et.end),
        (C.LOCK_BATCH_MQ, lk.lock_batch),
        (C.UNLOCK_BATCH_MQ, lk.unlock_batch),
        (C.GET_ALL_DELAY_OFFSET, a.all_delay_offsets),
        (C.HEART_BEAT, c.heartbeat),
        (C.CHECK_CLIENT_CONFIG, cc.check),
        (C.UNREGISTER_CLIENT, c.unregister_client),
        (C.GET_CONSUMER_LIST_BY_GROUP, c.consumer_list),
        (C.GET_CONSUMER_CONNECTION_LIST, c.consumer_connections),
        (C.QUERY_TOPIC_CONSUME_BY_WHO, c.consumed_by),
        (C.QUERY_CONSUMER_OFFSET, c.query_offset),
        (C.UPDATE_CONSUMER_OFFSET, c.update_offset),
        (C.GET_ALL_CONSUMER_OFFSET, c.all_offsets),
        (C.UPDATE_AND_CREATE_TOPIC, a.create_topic),
        (C.GET_ALL_TOPIC_CONFIG, a.all_topics),
        (C.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, a.create_group),
        (C.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, a.all_groups),
        (C.GET_TOPIC_STATS_INFO, a.topic_stats),
        (C.GET_CONSUME_STATS, a.consume_stats),
        (C.INVOKE_BROKER_TO_RESET_OFFSET, a.reset_offset),
        (C.GET_BROKER_RUNTIME_INFO, a.runtime_info),
        (C.GET_MAX_OFFSET, q.max_offset),
        (C.GET_MIN_OFFSET, q.min_offset),
        (C.SEARCH_OFFSET_BY_TIMESTAMP, q.search_offset),
        (C.GET_EARLIEST_MSG_STORETIME, q.earliest_time),
        (C.VIEW_MESSAGE_BY_ID, q.view_message),
        (C.QUERY_MESSAGE, q.query_message),
    ):
        ctl.table.register(code, fn)
