"""Retry routing on the broker without a network: a client's send to `%RETRY%{group}` (the
fallback when CONSUMER_SEND_MSG_BACK failed) and the retry/DLQ topics it creates.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_runtime.broker.controller import BrokerController
from broker_runtime.broker.processors.send_back import ensure_dlq_topic, route_retry_send
from broker_runtime.common.config import BrokerConfig, StoreConfig
from broker_runtime.common.message import (
    DELAY,
    MAX_RECONSUME_TIMES,
    RECONSUME_TIME,
    UNIQ_KEY,
    Message,
)
from broker_runtime.remoting.bodies import PERM_READ, PERM_WRITE
from broker_runtime.remoting.command import request
from broker_runtime.remoting.headers import SendMessageRequestHeader
from broker_runtime.remoting.protocol import RequestCode
from broker_runtime.remoting.protocol import ResponseCode as R

RETRY = "%RETRY%G"


@pytest.fixture
def ctl(tmp_path: Path) -> Iterator[BrokerController]:
    config = BrokerConfig(StoreConfig(tmp_path / "store"), max_reconsume_times=2)
    c = BrokerController(config)
    try:
        yield c
    finally:
        c.executor.shutdown()


def retry_send(
    ctl: BrokerController, props: dict[str, str], **header: int
) -> tuple[int | None, Message]:
    h = SendMessageRequestHeader("P", RETRY, 0, 0, **header)  # type: ignore[arg-type]
    cmd = request(RequestCode.SEND_MESSAGE, h.fields())
    msgs = [Message(RETRY, b"x", {UNIQ_KEY: "U1", **props})]
    refused = route_retry_send(ctl, cmd, SendMessageRequestHeader.decode(cmd), msgs)
    return (refused.code if refused else None), msgs[0]


def test_properties_below_the_limit_stay_in_the_retry_topic(ctl: BrokerController) -> None:
    code, msg = retry_send(ctl, {RECONSUME_TIME: "1", MAX_RECONSUME_TIMES: "3", DELAY: "4"})
    assert code is None
    assert (msg.topic, msg.reconsume_times, msg.properties[DELAY]) == (RETRY, 1, "4")
    assert RECONSUME_TIME not in msg.properties and MAX_RECONSUME_TIMES not in msg.properties


def test_properties_at_the_limit_go_to_a_write_only_dlq(ctl: BrokerController) -> None:
    code, msg = retry_send(ctl, {RECONSUME_TIME: "3", MAX_RECONSUME_TIMES: "3", DELAY: "6"})
    assert code is None
    assert (msg.topic, msg.queue_id, msg.reconsume_times) == ("%DLQ%G", 0, 3)
    assert DELAY not in msg.properties  # a dead letter is never scheduled
    dlq = ctl.topics.get("%DLQ%G")
    assert dlq is not None and dlq.perm == PERM_WRITE and not dlq.readable
    assert (dlq.read_queue_nums, dlq.write_queue_nums) == (1, 1)


def test_the_header_counts_when_there_are_no_properties(ctl: BrokerController) -> None:
    assert retry_send(ctl, {}, reconsume_times=4, max_reconsume_times=5)[1].topic == RETRY
    assert retry_send(ctl, {}, reconsume_times=5, max_reconsume_times=5)[1].topic == "%DLQ%G"


def test_without_a_limit_the_groups_retry_max_times_applies(ctl: BrokerController) -> None:
    # BrokerConfig.max_reconsume_times=2 is what auto-created groups get.
    assert retry_send(ctl, {RECONSUME_TIME: "1"})[1].topic == RETRY
    assert retry_send(ctl, {RECONSUME_TIME: "2"})[1].topic == "%DLQ%G"
    group = ctl.groups.find("G")
    assert group is not None and group.retry_max_times == 2


def test_a_bad_count_is_refused(ctl: BrokerController) -> None:
    with pytest.raises(ValueError, match="RECONSUME_TIME"):
        retry_send(ctl, {RECONSUME_TIME: "many"})


def test_unknown_group_is_refused_without_auto_create(tmp_path: Path) -> None:
    config = BrokerConfig(StoreConfig(tmp_path / "s"), auto_create_subscription_group=False)
    c = BrokerController(config)
    try:
        assert retry_send(c, {})[0] == R.SUBSCRIPTION_GROUP_NOT_EXIST
    finally:
        c.executor.shutdown()


def test_topics_are_created_once_and_kept(ctl: BrokerController) -> None:
    first = ensure_dlq_topic(ctl, "G")
    assert ensure_dlq_topic(ctl, "G") is first
    assert not first.perm & PERM_READ
    assert "%DLQ%G" in (ctl.topics.path.read_text())
