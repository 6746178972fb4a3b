"""Requests as the official Java client (Apache RocketMQ 4.9) writes them, taken by the broker
without a network: the cases tests/interop found, one regression test each."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from broker_runtime.acl.accounts import PUB
from broker_runtime.acl.signing import sign, verify
from broker_runtime.acl.validator import resources
from broker_runtime.broker.controller import BrokerController
from broker_runtime.broker.namesrv_client import register_body
from broker_runtime.broker.processors.consumer import ConsumerProcessor
from broker_runtime.broker.processors.send import SendProcessor
from broker_runtime.broker.stats import BrokerStats, human_bytes
from broker_runtime.common import fastjson
from broker_runtime.common.config import BrokerConfig, StoreConfig
from broker_runtime.common.message import properties_to_string
from broker_runtime.remoting.bodies import BodyError, decode_json, encode_batch
from broker_runtime.remoting.command import HeaderError, RemotingCommand, request
from broker_runtime.remoting.headers import (
    QueueOffsetHeader,
    SendMessageRequestHeader,
    UnregisterClientRequestHeader,
)
from broker_runtime.remoting.protocol import RequestCode as C
from broker_runtime.remoting.protocol import ResponseCode as R
from broker_runtime.store.message_store import MessageStore

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


@pytest.mark.parametrize(
    ("raw", "value"),
    [("true", True), ("TRUE", True), ("True", True), ("false", False), ("yes", False), ("", False)],
)
def test_booleans_are_read_as_boolean_parse_boolean_reads_them(raw: str, value: bool) -> None:
    h = SendMessageRequestHeader.of(command(C.SEND_MESSAGE_V2, {**JAVA_V2, "m": raw}))
    assert h.batch is value


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


def test_unregister_client_spells_client_id_as_rocketmq_does() -> None:
    fields = {"clientID": "192.0.2.2@7", "producerGroup": "CLIENT_INNER_PRODUCER"}
    h = UnregisterClientRequestHeader.decode(command(C.UNREGISTER_CLIENT, fields))
    assert (h.client_id, h.producer_group, h.consumer_group) == (
        "192.0.2.2@7", "CLIENT_INNER_PRODUCER", None,
    )  # fmt: skip
    assert UnregisterClientRequestHeader("c1").fields() == {"clientID": "c1"}


# -- fastjson's bodies ----------------------------------------------------------------------
# The real broker's consumerOffset.json and a TopicStatsTable as the real broker answers it.
REAL_OFFSETS = '{\n\t"offsetTable":{\n\t\t"MT@g1":{0:3,1:1,2:2,3:2\n\t\t}\n\t}\n}'
REAL_STATS = (
    '{"offsetTable":{{"brokerName":"broker-r","queueId":1,"topic":"MT"}:{"lastUpdateTimestamp"'
    ':1795694441342,"maxOffset":1,"minOffset":0},{"brokerName":"broker-r","queueId":0,"topic"'
    ':"MT"}:{"lastUpdateTimestamp":0,"maxOffset":0,"minOffset":0}}}'
)


def test_fastjson_number_keys_and_queue_keyed_maps_are_read() -> None:
    assert decode_json(REAL_OFFSETS.encode(), "offsets") == {
        "offsetTable": {"MT@g1": {"0": 3, "1": 1, "2": 2, "3": 2}}
    }
    rows = decode_json(REAL_STATS.encode(), "stats")["offsetTable"]
    assert rows[0] == {
        "brokerName": "broker-r", "queueId": 1, "topic": "MT",
        "lastUpdateTimestamp": 1795694441342, "maxOffset": 1, "minOffset": 0,
    }  # fmt: skip
    assert [r["queueId"] for r in rows] == [1, 0]


def test_queue_tables_are_written_as_fastjson_writes_them() -> None:
    rows = [{"topic": "T", "brokerName": "b", "queueId": 0, "offset": 7}]
    reset = fastjson.dumps_queue_table(rows, scalar=True)
    assert reset == b'{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:7}}'
    assert decode_json(reset, "reset")["offsetTable"] == rows
    stats = [{"topic": "T", "brokerName": "b", "queueId": 1, "brokerOffset": 3, "lock": {"a": 1}}]
    body = fastjson.dumps_queue_table(stats, consumeTps=0.5)
    assert body.startswith(b'{"consumeTps":0.5,"offsetTable":{{"brokerName":"b","queueId":1,')
    assert decode_json(body, "stats") == {"consumeTps": 0.5, "offsetTable": stats}
    assert decode_json(fastjson.dumps_queue_table([]), "empty") == {"offsetTable": {}}


@pytest.mark.parametrize(
    "bad",
    ['{"a":{1:2', '{{"x":1}:2}', '{"a":1,{"brokerName":"b","queueId":0,"topic":"T"}:1}', "{a:1}",
     '{"a":[1,}', '{"a":1} x'],
)  # fmt: skip
def test_malformed_fastjson_is_a_body_error(bad: str) -> None:
    with pytest.raises(BodyError, match="not JSON"):
        decode_json(bad.encode(), "test")


# -- what the broker stores -----------------------------------------------------------------
def test_stored_properties_are_rocketmqs(ctl: BrokerController) -> None:
    """A single message loses WAIT (unless delayed) and gains CLUSTER; a batch's own properties
    (WAIT, from MessageBatch) and CLUSTER are appended to each of its messages."""
    ctl.store = MessageStore(ctl.config.store)
    conn = SimpleNamespace(peer_addr=("127.0.0.1", 5))
    send = SendProcessor(ctl)
    try:
        one = request(C.SEND_MESSAGE_V2, JAVA_V2, b"one")
        later = request(C.SEND_MESSAGE_V2, {**JAVA_V2, "i": "WAIT\x01true\x02DELAY\x011\x02"})
        items = [(b"b0", {"UNIQ_KEY": "U0"}, 0), (b"b1", {"UNIQ_KEY": "U1", "k": "v"}, 0)]
        batch_fields = {**JAVA_V2, "m": "true", "i": properties_to_string({"WAIT": "true"})}
        many = request(C.SEND_BATCH_MESSAGE, batch_fields, encode_batch(items))
        for cmd in (one, many, later):
            assert asyncio.run(send.send(cmd, conn)).code == R.SUCCESS  # type: ignore[arg-type]
        assert ctl.store.wait_dispatched(5.0)
        props, pos = [], 0
        while (m := ctl.store.message_at(pos)) is not None:
            props.append(m.properties)
            pos += m.total_size
    finally:
        ctl.store.shutdown()
    cluster = {"CLUSTER": "DefaultCluster"}
    assert props == [
        {"KEYS": "k-1", "TAGS": "TagA", **cluster},
        {"UNIQ_KEY": "U0", "WAIT": "true", **cluster},
        {"UNIQ_KEY": "U1", "k": "v", "WAIT": "true", **cluster},
        {"WAIT": "true", "DELAY": "1", **cluster, "REAL_TOPIC": "MT", "REAL_QID": "3"},
    ]


def test_rates_and_totals_for_mqadmin() -> None:
    stats = BrokerStats(boot_ms=0)
    stats.sample(1_000)
    stats.on_put(30)
    stats.on_got(10)
    stats.sample(11_000)
    assert (stats.tps(1, 10), stats.tps(2, 10)) == (3.0, 1.0)
    assert stats.rates(1) == "3.0 3.0 3.0"
    stats.on_put(5)
    stats.sample(86_400_000 + 5)  # a new day: this morning's total is the count so far
    assert (stats.put_today_morning, stats.put_yesterday_morning) == (35, 0)
    assert [human_bytes(n) for n in (1000, 1536, 62_000_000_000)] == [
        "1000 B",
        "1.5 KiB",
        "57.7 GiB",
    ]


def test_the_unique_key_flag_a_java_query_adds_after_signing_is_not_signed() -> None:
    header = {"topic": "T", "key": "k", "maxNum": "32", "beginTimestamp": "0", "endTimestamp": "9"}
    fields = sign(header, b"", "ak", "sk")  # AclClientRPCHook signs the header's fields
    fields["_UNIQUE_KEY_QUERY"] = "false"  # MQClientAPIImpl.queryMessage adds this one later
    assert verify(fields, b"", "sk")
    assert not verify({**fields, "key": "other"}, b"", "sk")


def test_a_new_groups_first_offset_query_answers_as_rocketmqs(ctl: BrokerController) -> None:
    """queryConsumerOffset: 0 while the queue starts at 0 and its first message is in memory,
    so a new group reads it from the start; the committed offset once there is one."""
    ctl.store = MessageStore(ctl.config.store)
    consumer = ConsumerProcessor(ctl)
    conn = SimpleNamespace(peer_addr=("127.0.0.1", 5))

    def query(queue: int) -> tuple[int, str | None]:
        cmd = request(C.QUERY_CONSUMER_OFFSET, QueueOffsetHeader("G", "T", queue).fields())
        resp = asyncio.run(consumer.query_offset(cmd, conn))  # type: ignore[arg-type]
        return resp.code, resp.ext_fields.get("offset")

    try:
        assert query(0) == (R.SUCCESS, "0")  # an empty queue starts at 0 too
        ctl.offsets.commit("T", "G", 1, 7)
        assert query(1) == (R.SUCCESS, "7")
    finally:
        ctl.store.shutdown()
