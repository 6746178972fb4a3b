"""The harness itself: the real broker takes the official producer's messages and serves them
to the official consumer, each as sent. Every other interop test leans on this."""

from __future__ import annotations

import pytest

from tests.interop.conftest import RealRocketMQ
from tests.interop.rocketmq import java

pytestmark = [pytest.mark.integration, pytest.mark.interop]


def test_the_real_broker_serves_the_official_clients(real_rocketmq: RealRocketMQ) -> None:
    ns = real_rocketmq.namesrv_addr
    sent = java(
        "Producer",
        "--namesrv",
        ns,
        "--topic",
        "HarnessT",
        "--count",
        "8",
        "--keys",
        "k",
        "--tags",
        "TagA",
        "--prop",
        "color=red",
    )
    acks = [row for row in sent if "status" in row]
    assert [row["status"] for row in acks] == ["SEND_OK"] * 8
    got = java(
        "PushConsumer",
        "--namesrv",
        ns,
        "--topic",
        "HarnessT",
        "--group",
        "harness_g",
        "--expect",
        "8",
        "--idle-ms",
        "20000",
    )
    received = {row["msgId"]: row for row in got if "msgId" in row}
    assert set(received) == {row["msgId"] for row in acks}
    for ack in acks:
        row = received[ack["msgId"]]
        i = ack["i"]
        assert (row["body"], row["keys"], row["tags"]) == (f"body-{i}", f"k-{i}", "TagA")
        assert row["properties"]["color"] == "red"
        assert (row["queueId"], row["queueOffset"]) == (ack["queueId"], ack["queueOffset"])
