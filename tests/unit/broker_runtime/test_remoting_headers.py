"""Typed headers and bodies: RocketMQ's wire names, round trips, and named errors."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker_runtime.remoting.bodies import (
    BodyError,
    BrokerData,
    ConsumerData,
    HeartbeatData,
    QueueData,
    SubscriptionData,
    TopicRouteData,
    decode_batch,
    encode_batch,
)
from broker_runtime.remoting.command import HeaderError, request
from broker_runtime.remoting.framing import FrameDecoder, encode
from broker_runtime.remoting.headers import (
    PullMessageRequestHeader,
    QueueOffsetHeader,
    SendMessageRequestHeader,
)
from broker_runtime.remoting.protocol import RequestCode


def test_header_wire_names_are_rocketmq_camel_case() -> None:
    h = SendMessageRequestHeader("pg", "T", 2, 1700000000000, properties="a\x01b\x02", batch=True)
    cmd = request(RequestCode.SEND_MESSAGE, h.fields())
    assert cmd.ext_fields["producerGroup"] == "pg"
    assert cmd.ext_fields["bornTimestamp"] == "1700000000000"
    assert cmd.ext_fields["batch"] == "true"
    assert "maxReconsumeTimes" not in cmd.ext_fields  # None is not sent
    (back,) = FrameDecoder().feed(encode(cmd))
    assert SendMessageRequestHeader.decode(back) == h


def test_defaults_fill_in_and_errors_name_the_field() -> None:
    cmd = request(RequestCode.PULL_MESSAGE, {"consumerGroup": "g", "topic": "t", "queueId": 0})
    with pytest.raises(HeaderError, match="'queueOffset'"):
        PullMessageRequestHeader.decode(cmd)
    cmd.ext_fields["queueOffset"] = "12"
    h = PullMessageRequestHeader.decode(cmd)
    # No subscription in the pull: the broker takes the one the group's heartbeat registered.
    assert (h.queue_offset, h.max_msg_nums, h.subscription) == (12, 32, None)
    cmd.ext_fields["maxMsgNums"] = "lots"
    with pytest.raises(HeaderError, match="'maxMsgNums' has a bad value"):
        PullMessageRequestHeader.decode(cmd)
    q = request(14, {"consumerGroup": "g", "topic": "t", "queueId": 1, "commitOffset": "x"})
    with pytest.raises(HeaderError, match="commitOffset"):
        QueueOffsetHeader.decode(q)


def test_route_and_heartbeat_bodies_round_trip() -> None:
    route = TopicRouteData(
        [QueueData("broker-a", 4, 4), QueueData("broker-b", 8, 8, 4)],
        [BrokerData("c", "broker-a", {0: "127.0.0.1:1", 1: "127.0.0.1:2"})],
    )
    assert TopicRouteData.decode(route.encode()) == route
    assert route.broker_datas[0].master_addr() == "127.0.0.1:1"
    hb = HeartbeatData(
        "cid@1", ["pg"], [ConsumerData("g", subscriptions=[SubscriptionData("T", "A || B")])]
    )
    assert HeartbeatData.decode(hb.encode()) == hb
    with pytest.raises(BodyError, match="route body"):
        TopicRouteData.decode(b'{"queueDatas":[{"x":1}]}')
    with pytest.raises(BodyError, match="not JSON"):
        HeartbeatData.decode(b"\x00")


props = st.dictionaries(
    st.text("abcXYZ_", min_size=1, max_size=8), st.text("abc 123", max_size=8), max_size=4
)


@given(st.lists(st.tuples(st.binary(max_size=100), props, st.integers(0, 2**31 - 1)), max_size=8))
def test_batch_round_trip(items: list[tuple[bytes, dict[str, str], int]]) -> None:
    assert decode_batch(encode_batch(items)) == items


@given(
    st.binary(max_size=64)
    | st.builds(
        lambda b, n: encode_batch(b)[:-n] if n else encode_batch(b),
        st.lists(
            st.tuples(st.binary(max_size=20), props, st.integers(0, 9)), min_size=1, max_size=3
        ),
        st.integers(0, 3),
    )
)
def test_batch_garbage_is_a_body_error_or_items_that_round_trip(raw: bytes) -> None:
    try:
        items = decode_batch(raw)
    except BodyError as e:
        assert re.fullmatch(r"batch entry at byte \d+ (is truncated|has .+)", str(e)), str(e)
        return
    assert decode_batch(encode_batch(items)) == items
    assert len(encode_batch(items)) == len(raw)  # every byte was an entry's
