"""Apache RocketMQ's own mqadmin (rocketmq-tools 4.9.7) against mqaudit's cluster: what each
command prints, parsed, against what the official producer sent and what mqaudit itself says
(its name server and broker answers, consumerOffset.json, `mqaudit cluster status`)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import pytest

from broker_runtime.common import fastjson
from broker_runtime.remoting.bodies import decode_json
from broker_runtime.remoting.protocol import RequestCode as C
from tests.integration.cluster_fixtures import Cluster, RawClient
from tests.interop.rocketmq import java, mqadmin

pytestmark = [pytest.mark.integration, pytest.mark.interop]

TOPIC, GROUP, BROKER = "JAdmin", "j_admin", "broker-a"
# mqadmin writes its log (logback_tools.xml) and exception traces among its output.
_NOISE = re.compile(r"^(\d\d:\d\d:\d\d\.\d{3} |\tat |\t\.\.\. |For more information|\S+Exception)")


def admin(cluster: Cluster, *args: str) -> list[str]:
    """What mqadmin printed, without its log lines and exception traces."""
    out = mqadmin(cluster.namesrv_addr, *args)
    return [line for line in out.splitlines() if line.strip() and not _NOISE.match(line)]


def table(lines: list[str], header: str) -> list[list[str]]:
    """The rows after the header line that starts with `header`, split on whitespace."""
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    return [line.split() for line in lines[start + 1 :] if not line.startswith("#")]


def fields(lines: list[str]) -> dict[str, str]:
    """`Name:   value` lines (queryMsgById and friends) and `name : value` (brokerStatus)."""
    out = {}
    for line in lines:
        name, sep, value = line.partition(":")
        if sep:
            out[name.strip()] = value.strip()
    return out


def call(cluster: Cluster, addr: str, code: int, body_fields: dict[str, object]) -> Any:
    async def run() -> Any:
        c = RawClient()
        try:
            resp = await c.call(addr, code, body_fields)
            return decode_json(resp.body, str(code)) if resp.body else {}
        finally:
            await c.close()

    return asyncio.run(run())


@pytest.fixture(scope="module")
def sent(mqaudit_cluster: Cluster) -> dict[int, dict[str, Any]]:
    """Six messages with keys and tags, consumed once by GROUP; i -> the producer's ack."""
    ns = mqaudit_cluster.namesrv_addr
    args = ("--topic", TOPIC, "--count", "6", "--keys", "ak", "--tags", "TagA")
    rows = java("Producer", "--namesrv", ns, *args)
    acks = {r["i"]: r for r in rows if "i" in r}
    assert [a["status"] for a in acks.values()] == ["SEND_OK"] * 6
    got = java("PushConsumer", "--namesrv", ns, "--group", GROUP, "--topic", TOPIC, "--expect", "6")
    assert sorted(r["msgId"] for r in got if "msgId" in r) == sorted(
        a["msgId"] for a in acks.values()
    )
    return acks


def queue_ends(sent: dict[int, dict[str, Any]]) -> dict[int, int]:
    ends = dict.fromkeys(range(4), 0)
    for a in sent.values():
        ends[a["queueId"]] = max(ends[a["queueId"]], a["queueOffset"] + 1)
    return ends


def offsets_json(cluster: Cluster) -> dict[str, dict[str, int]]:
    path = cluster.store_dir(f"{BROKER}-master") / "config" / "consumerOffset.json"
    table: dict[str, dict[str, int]] = json.loads(path.read_text())["offsetTable"]
    return table


def wait_offsets(cluster: Cluster, want: dict[str, int]) -> dict[str, int]:
    deadline, got = time.monotonic() + 20, {}
    while time.monotonic() < deadline:
        got = offsets_json(cluster).get(f"{TOPIC}@{GROUP}", {})
        if got == want:
            break
        time.sleep(0.2)
    return got


def test_cluster_list_and_broker_status(mqaudit_cluster: Cluster, sent: dict[int, Any]) -> None:
    addr = mqaudit_cluster.addr(f"{BROKER}-master")
    rows = table(admin(mqaudit_cluster, "clusterList"), "#Cluster Name")
    assert [r[:5] for r in rows] == [["DefaultCluster", BROKER, "0", addr, "V4_9_7"]]
    status = fields(admin(mqaudit_cluster, "brokerStatus", "-b", addr))
    own = next(n for n in mqaudit_cluster.status()["nodes"] if n["name"] == f"{BROKER}-master")
    assert (status["brokerVersionDesc"], status["brokerName"]) == ("V4_9_7", BROKER)
    for key in ("commitLogMaxOffset", "commitLogMinOffset", "brokerRole", "flushDiskType"):
        assert status[key] == own["runtime"][key], key
    assert int(status["msgPutTotalTodayNow"]) == 6  # the six sends, nothing else was put
    assert int(status["msgGetTotalTodayNow"]) == 6  # each handed to the consumer once
    assert len(status["putTps"].split()) == 3


def test_topic_list_route_and_status(mqaudit_cluster: Cluster, sent: dict[int, Any]) -> None:
    listed = set(admin(mqaudit_cluster, "topicList"))
    ns = mqaudit_cluster.namesrv_addr.split(";")[0]
    own = set(call(mqaudit_cluster, ns, C.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, {})["topicList"])
    assert listed == own and {TOPIC, f"%RETRY%{GROUP}", "TBW102"} <= listed
    route = fastjson.loads("\n".join(admin(mqaudit_cluster, "topicRoute", "-t", TOPIC)))
    assert route["brokerDatas"] == [
        {"brokerAddrs": {"0": mqaudit_cluster.addr(f"{BROKER}-master")}, "brokerName": BROKER,
         "cluster": "DefaultCluster"}
    ]  # fmt: skip
    (queues,) = route["queueDatas"]
    assert (queues["readQueueNums"], queues["writeQueueNums"], queues["perm"]) == (4, 4, 6)
    rows = table(admin(mqaudit_cluster, "topicStatus", "-t", TOPIC), "#Broker Name")
    ends = queue_ends(sent)
    assert [(r[0], int(r[1]), int(r[2]), int(r[3])) for r in rows] == [
        (BROKER, q, 0, ends[q]) for q in range(4)
    ]
    for r in rows:  # #Last Updated: a time for every queue holding messages
        assert (len(r) == 6) == (ends[int(r[1])] > 0)


def test_update_topic(mqaudit_cluster: Cluster) -> None:
    addr = mqaudit_cluster.addr(f"{BROKER}-master")
    out = admin(mqaudit_cluster, "updateTopic", "-t", "JAdminNew", "-b", addr, "-r", "3", "-w", "2")
    assert out[0] == f"create topic to {addr} success."
    configs = call(mqaudit_cluster, addr, C.GET_ALL_TOPIC_CONFIG, {})["topicConfigTable"]
    new = configs["JAdminNew"]
    assert (new["readQueueNums"], new["writeQueueNums"], new["perm"]) == (3, 2, 6)
    deadline = time.monotonic() + 20  # registered with the name server right away
    while time.monotonic() < deadline:
        route = fastjson.loads("\n".join(admin(mqaudit_cluster, "topicRoute", "-t", "JAdminNew")))
        if route.get("queueDatas"):
            break
    assert route["queueDatas"][0]["writeQueueNums"] == 2


def test_consumer_progress(mqaudit_cluster: Cluster, sent: dict[int, Any]) -> None:
    ends = queue_ends(sent)
    assert wait_offsets(mqaudit_cluster, {str(q): e for q, e in ends.items()}) == {
        str(q): e for q, e in ends.items()
    }
    lines = admin(mqaudit_cluster, "consumerProgress", "-g", GROUP)
    rows = [r for r in table(lines, "#Topic") if r and r[0] == TOPIC]
    assert [(r[1], int(r[2]), int(r[3]), int(r[4]), int(r[5])) for r in rows] == [
        (BROKER, q, ends[q], ends[q], 0) for q in range(4)
    ]
    assert "Diff Total: 0" in lines
    groups = table(admin(mqaudit_cluster, "consumerProgress"), "#Group")
    assert [GROUP, "0", "OFFLINE", "0", "0"] in groups  # no client online, nothing behind


def test_query_messages_by_id_key_and_offset(
    mqaudit_cluster: Cluster, sent: dict[int, Any]
) -> None:
    ack = sent[1]
    raw = mqadmin(mqaudit_cluster.namesrv_addr, "queryMsgById", "-i", ack["offsetMsgId"])
    # Who consumed it (QUERY_TOPIC_CONSUME_BY_WHO, then GET_CONSUMER_CONNECTION_LIST).
    assert f"MessageTrack [consumerGroup={GROUP}, trackType=NOT_ONLINE" in raw
    out = fields([line for line in raw.splitlines() if not _NOISE.match(line)])
    assert (out["OffsetID"], out["Topic"], out["Tags"], out["Keys"]) == (
        ack["offsetMsgId"], TOPIC, "[TagA]", "[ak-1]",
    )  # fmt: skip
    assert (int(out["Queue ID"]), int(out["Queue Offset"])) == (ack["queueId"], ack["queueOffset"])
    assert f"UNIQ_KEY={ack['msgId']}" in out["Properties"]
    assert "CLUSTER=DefaultCluster" in out["Properties"]
    rows = table(admin(mqaudit_cluster, "queryMsgByKey", "-t", TOPIC, "-k", "ak-1"), "#Message ID")
    assert rows == [[ack["msgId"], str(ack["queueId"]), str(ack["queueOffset"])]]
    args = ("-t", TOPIC, "-b", BROKER, "-i", str(ack["queueId"]), "-o", str(ack["queueOffset"]))
    out = fields(admin(mqaudit_cluster, "queryMsgByOffset", *args))
    assert (out["OffsetID"], out["Keys"]) == (ack["offsetMsgId"], "[ak-1]")
    unique = fields(admin(mqaudit_cluster, "queryMsgByUniqueKey", "-t", TOPIC, "-i", ack["msgId"]))
    assert (unique["Keys"], int(unique["Queue Offset"])) == ("[ak-1]", ack["queueOffset"])


def test_reset_offset_by_time(mqaudit_cluster: Cluster, sent: dict[int, Any]) -> None:
    ends = queue_ends(sent)
    wait_offsets(mqaudit_cluster, {str(q): e for q, e in ends.items()})
    lines = admin(mqaudit_cluster, "resetOffsetByTime", "-g", GROUP, "-t", TOPIC, "-s", "0")
    rows = table(lines, "#brokerName")
    assert sorted((r[0], int(r[1]), int(r[2])) for r in rows) == [(BROKER, q, 0) for q in range(4)]
    assert offsets_json(mqaudit_cluster)[f"{TOPIC}@{GROUP}"] == dict.fromkeys("0123", 0)
    lines = admin(mqaudit_cluster, "consumerProgress", "-g", GROUP)
    assert f"Diff Total: {len(sent)}" in lines
