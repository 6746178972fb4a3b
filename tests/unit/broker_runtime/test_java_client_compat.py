"""Requests as the official Java client (Apache RocketMQ 4.9) writes them, taken by the broker
without a network: the cases tests/interop found, one regression test each."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_runtime.acl.accounts import PUB
from broker_runtime.acl.validator import resources
from broker_runtime.broker.controller import BrokerController
from broker_runtime.broker.namesrv_client import register_body
from broker_runtime.common.config import BrokerConfig, StoreConfig
from broker_runtime.remoting.bodies import decode_json
from broker_runtime.remoting.command import HeaderError, RemotingCommand
from broker_runtime.remoting.headers import SendMessageRequestHeader
from broker_runtime.remoting.protocol import RequestCode as C

# SendMessageRequestHeaderV2 as DefaultMQProducer sends it (JSON serialization: every field a
# string, the primitive booleans k and m always present, maxReconsumeTimes l only on retries).
JAVA_V2 = {
    "a": "interop_producer",
    "b": "MT",
    "c": "TBW102",
    "d": "4",
    "e": "3",
    "f": "0",
    "g": "1795693594228",
    "h": "0",
    "i": "KEYS\x01k-1\x02TAGS\x01TagA\x02WAIT\x01true\x02",
    "j": "0",
    "k": "false",
    "m": "false",
}


def command(code: int, fields: dict[str, str]) -> RemotingCommand:
    return RemotingCommand(code, ext_fields=dict(fields))


@pytest.fixture
def ctl(tmp_path: Path) -> Iterator[BrokerController]:
    c = BrokerController(BrokerConfig(StoreConfig(tmp_path / "store"), default_queue_nums=8))
    try:
        yield c
    finally:
        c.executor.shutdown()


def test_send_message_v2_is_read_by_its_one_letter_names() -> None:
    h = SendMessageRequestHeader.of(command(C.SEND_MESSAGE_V2, JAVA_V2))
    assert (h.producer_group, h.topic, h.queue_id, h.born_timestamp) == (
        "interop_producer", "MT", 3, 1795693594228,
    )  # fmt: skip
    assert (h.default_topic, h.default_topic_queue_nums, h.batch) == ("TBW102", 4, False)
    assert h.properties == JAVA_V2["i"]
    assert h.max_reconsume_times is None


def test_a_java_batch_carries_the_v2_header_and_an_old_one_is_still_taken() -> None:
    h = SendMessageRequestHeader.of(command(C.SEND_BATCH_MESSAGE, {**JAVA_V2, "m": "true"}))
    assert (h.topic, h.batch) == ("MT", True)
    old = SendMessageRequestHeader("pg", "T", 1, 5, batch=True)
    assert SendMessageRequestHeader.of(command(C.SEND_BATCH_MESSAGE, old.fields())) == old


def test_a_v2_header_without_a_required_field_names_it() -> None:
    fields = {k: v for k, v in JAVA_V2.items() if k != "d"}
    with pytest.raises(HeaderError, match="'d'"):
        SendMessageRequestHeader.of(command(C.SEND_MESSAGE_V2, fields))


def test_the_long_header_sends_what_rocketmqs_broker_requires() -> None:
    fields = SendMessageRequestHeader("pg", "T", 0, 5).fields()
    assert {"defaultTopic", "defaultTopicQueueNums", "sysFlag", "flag"} <= set(fields)
    assert fields["defaultTopic"] == "TBW102"


def test_the_auto_create_topic_is_registered_while_auto_create_is_on(
    ctl: BrokerController, tmp_path: Path
) -> None:
    tbw = ctl.topics.get("TBW102")
    assert tbw is not None and tbw.perm == 7  # inherit | read | write
    assert (tbw.read_queue_nums, tbw.write_queue_nums) == (8, 8)
    assert "TBW102" in decode_json(register_body(ctl), "register")["topicConfigTable"]
    off = BrokerController(BrokerConfig(StoreConfig(tmp_path / "off"), auto_create_topic=False))
    try:
        assert off.topics.get("TBW102") is None
    finally:
        off.executor.shutdown()


def test_a_new_topic_gets_the_clients_queue_count_up_to_the_brokers(
    ctl: BrokerController,
) -> None:
    two = ctl.topic_for_send("Two", 2)
    many = ctl.topic_for_send("Many", 16)
    assert two is not None and (two.read_queue_nums, two.write_queue_nums) == (2, 2)
    assert many is not None and many.write_queue_nums == 8


def test_acl_reads_the_topic_of_a_v2_send() -> None:
    assert resources(command(C.SEND_MESSAGE_V2, JAVA_V2)) == [("topic", "MT", PUB)]
    batch = command(C.SEND_BATCH_MESSAGE, {**JAVA_V2, "m": "true"})
    assert resources(batch) == [("topic", "MT", PUB)]
