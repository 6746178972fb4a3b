"""Bodies as Apache RocketMQ 4.9.7 writes them (fastjson): captured from its name server and
broker, parsed as its own client parses them. fastjson leaves a map's non-string keys
unquoted, which strict JSON refuses: `mqaudit produce --namesrv <real name server>` failed
with "106 body is not JSON: Expecting property name enclosed in double quotes"."""

from __future__ import annotations

import pytest

from broker_runtime.remoting.bodies import BodyError, TopicRouteData, decode_json

# GET_ROUTEINFO_BY_TOPIC (105) of TBW102, asked with request version 0 (below V4_9_4 the
# name server answers fastjson's default output).
ROUTE = (
    b'{"brokerDatas":[{"brokerAddrs":{0:"127.0.0.1:42169"},"brokerName":"broker-r",'
    b'"cluster":"interop"}],"filterServerTable":{},"queueDatas":[{"brokerName":"broker-r",'
    b'"perm":7,"readQueueNums":8,"topicSysFlag":0,"writeQueueNums":8}]}'
)
# GET_BROKER_CLUSTER_INFO (106): no request version makes this one strict JSON.
CLUSTER = (
    b'{"brokerAddrTable":{"broker-r":{"brokerAddrs":{0:"127.0.0.1:42169"},'
    b'"brokerName":"broker-r","cluster":"interop"}},"clusterAddrTable":{"interop":["broker-r"]}}'
)
# GET_CONSUME_STATS (208) from the broker: MessageQueue objects as the map's keys.
CONSUME_STATS = (
    b'{"consumeTps":0.0,"offsetTable":{{"brokerName":"broker-r","queueId":0,"topic":"OcT1"}:'
    b'{"brokerOffset":2,"consumerOffset":2,"lastTimestamp":1795692651159},'
    b'{"brokerName":"broker-r","queueId":1,"topic":"OcT1"}:'
    b'{"brokerOffset":4,"consumerOffset":3,"lastTimestamp":1795692652404}}}'
)

# GET_TOPIC_STATS_INFO (202): TopicStatsTable, MessageQueue keys too.
TOPIC_STATS = (
    b'{"offsetTable":{{"brokerName":"broker-r","queueId":0,"topic":"OcT1"}:'
    b'{"lastUpdateTimestamp":1795692651159,"maxOffset":2,"minOffset":0}}}'
)
# INVOKE_BROKER_TO_RESET_OFFSET (222) answer, the same ResetOffsetBody the broker sends each
# online consumer of the group with RESET_CONSUMER_CLIENT_OFFSET: a number per queue.
RESET = (
    b'{"offsetTable":{{"brokerName":"broker-r","queueId":0,"topic":"OcT1"}:0,'
    b'{"brokerName":"broker-r","queueId":1,"topic":"OcT1"}:7}}'
)


def test_a_route_from_the_real_name_server_is_parsed() -> None:
    route = TopicRouteData.decode(ROUTE)
    assert [(b.cluster, b.broker_name, b.broker_addrs) for b in route.broker_datas] == [
        ("interop", "broker-r", {0: "127.0.0.1:42169"})
    ]
    assert route.broker_datas[0].master_addr() == "127.0.0.1:42169"
    q = route.queue_datas[0]
    assert (q.broker_name, q.read_queue_nums, q.write_queue_nums, q.perm) == ("broker-r", 8, 8, 7)
    # The strict JSON the same name server writes for a client of V4_9_4 or later: the same.
    assert TopicRouteData.decode(ROUTE.replace(b"{0:", b'{"0":')) == route


def test_cluster_info_from_the_real_name_server_is_parsed() -> None:
    info = decode_json(CLUSTER, "106")
    assert info == {
        "brokerAddrTable": {
            "broker-r": {
                "brokerAddrs": {"0": "127.0.0.1:42169"},
                "brokerName": "broker-r",
                "cluster": "interop",
            }
        },
        "clusterAddrTable": {"interop": ["broker-r"]},
    }


def test_strings_that_look_like_keys_are_left_alone() -> None:
    body = b'{"a":{1:"{2:3}, 4:\\"x\\""},"b":[{-5:true}],"c":"\\\\"}'
    assert decode_json(body, "t") == {"a": {"1": '{2:3}, 4:"x"'}, "b": [{"-5": True}], "c": "\\"}


@pytest.mark.parametrize(
    "bad",
    [b'{"a":1"}', b"{0:1", b'{"a":1', b"{0:}", b"\xff", b"", b"nonsense", b'{{"x":1}:2}'],
)
def test_what_is_neither_json_nor_fastjson_is_refused_by_name(bad: bytes) -> None:
    with pytest.raises(BodyError, match="t body is not JSON"):
        decode_json(bad, "t")


def test_a_non_object_is_refused() -> None:
    with pytest.raises(BodyError, match="not a JSON object"):
        decode_json(b"[{0:1}]", "t")


def test_offset_tables_keyed_by_message_queue_become_rows() -> None:
    """ConsumeStats, TopicStatsTable and ResetOffsetBody as the real broker wrote them: one
    row per queue, its figures beside it (common/fastjson.py's reading)."""
    q0 = {"brokerName": "broker-r", "queueId": 0, "topic": "OcT1"}
    q1 = {**q0, "queueId": 1}
    assert decode_json(CONSUME_STATS, "208")["offsetTable"] == [
        {**q0, "brokerOffset": 2, "consumerOffset": 2, "lastTimestamp": 1795692651159},
        {**q1, "brokerOffset": 4, "consumerOffset": 3, "lastTimestamp": 1795692652404},
    ]
    assert decode_json(TOPIC_STATS, "202")["offsetTable"] == [
        {**q0, "lastUpdateTimestamp": 1795692651159, "maxOffset": 2, "minOffset": 0}
    ]
    assert decode_json(RESET, "222")["offsetTable"] == [{**q0, "offset": 0}, {**q1, "offset": 7}]
