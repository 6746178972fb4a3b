"""Apache RocketMQ's official Java client (4.9.7) against mqaudit's cluster, message by message:
every send mode, push consumers clustering / broadcasting / by tag, retry into %RETRY% and
%DLQ%, the lite pull consumer's commits, and ACL with the official AclClientRPCHook. What the
Java consumer received is held against what the producer was told and what mqaudit's broker
itself serves (a pull of every queue with mqaudit's own wire client) and keeps
(consumerOffset.json)."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from broker_runtime.common.message import StoredMessage
from broker_runtime.remoting.bodies import (
    ConsumerData,
    HeartbeatData,
    SubscriptionData,
    decode_json,
)
from broker_runtime.remoting.headers import QueryMessageRequestHeader
from broker_runtime.remoting.protocol import RequestCode as C
from broker_runtime.remoting.protocol import ResponseCode as R
from tests.integration.cluster_fixtures import Cluster, RawClient, decode_units, running_cluster
from tests.interop.conftest import MQAUDIT_SETTINGS
from tests.interop.rocketmq import java

pytestmark = [pytest.mark.integration, pytest.mark.interop]

TOPIC = "JSends"
BROKER = "broker-a"
CLUSTER = {"CLUSTER": "DefaultCluster"}
CONSUMER_SIDE = ("MIN_OFFSET", "MAX_OFFSET", "CONSUME_START_TIME")  # the client adds these
# Each run of the official producer: its arguments and what every message of it must carry.
RUNS: dict[str, tuple[list[str], dict[str, str]]] = {
    "sync": (["--count", "4", "--keys", "sk", "--tags", "TagA", "--prop", "color=red"],
             {"TAGS": "TagA", "color": "red"}),
    "async": (["--mode", "async", "--count", "3", "--keys", "ak", "--tags", "TagB"],
              {"TAGS": "TagB"}),
    "oneway": (["--mode", "oneway", "--count", "2", "--tags", "TagC"], {"TAGS": "TagC"}),
    "batch": (["--mode", "batch", "--count", "4", "--batch", "2", "--prop", "color=blue"],
              {"color": "blue", "WAIT": "true"}),  # the batch's own WAIT, appended to each
    "ordered": (["--mode", "ordered", "--count", "4", "--shards", "2", "--keys", "ok"], {}),
    "delay": (["--count", "1", "--delay-level", "2", "--tags", "TagD"],
              {"TAGS": "TagD", "WAIT": "true", "REAL_TOPIC": TOPIC}),
}  # fmt: skip


def produce(ns: str, topic: str, *args: str) -> list[dict[str, Any]]:
    rows = java("Producer", "--namesrv", ns, "--topic", topic, *args)
    assert rows[-1]["done"] and rows[-1]["failed"] == 0, rows[-1]
    return [r for r in rows if "i" in r]


def consume(ns: str, group: str, topic: str, *args: str) -> list[dict[str, Any]]:
    """The deliveries of one PushConsumer run (its summary checked against them)."""
    rows = java("PushConsumer", "--namesrv", ns, "--group", group, "--topic", topic, *args)
    got = [r for r in rows if "msgId" in r]
    assert rows[-1]["done"] and rows[-1]["deliveries"] == len(got)
    return got


def stored(row: dict[str, Any]) -> dict[str, str]:
    """A delivered message's properties as the broker stored them."""
    return {k: v for k, v in row["properties"].items() if k not in CONSUMER_SIDE}


def broker_view(
    cluster: Cluster, topic: str, credentials: tuple[str, str] | None = None
) -> dict[str, StoredMessage]:
    """Every message of `topic`'s 4 queues as mqaudit's broker serves it, by UNIQ_KEY (pulled
    with mqaudit's own wire client, a group of its own)."""

    async def pull_all() -> list[StoredMessage]:
        c = RawClient(credentials)
        try:
            out: list[StoredMessage] = []
            for q in range(4):
                _, msgs = await c.pull(cluster.addr(f"{BROKER}-master"), topic, q, 0, max_nums=64)
                out += msgs
            return out
        finally:
            await c.close()

    msgs = asyncio.run(pull_all())
    keys = Counter(m.uniq_key for m in msgs)
    assert all(n == 1 for n in keys.values()), keys.most_common(3)
    return {str(m.uniq_key): m for m in msgs}


def committed(cluster: Cluster, key: str, want: dict[str, int]) -> dict[str, int]:
    """`topic@group` in mqaudit's consumerOffset.json once it holds `want` (persisted every
    second), or what it holds at the deadline."""
    path = cluster.store_dir(f"{BROKER}-master") / "config" / "consumerOffset.json"
    deadline = time.monotonic() + 20
    table: dict[str, int] = {}
    while time.monotonic() < deadline:
        if path.exists():
            table = json.loads(path.read_text())["offsetTable"].get(key, {})
            if table == want:
                break
        time.sleep(0.2)
    return table


def queue_ends(view: dict[str, StoredMessage]) -> dict[str, int]:
    ends: dict[str, int] = {str(q): 0 for q in range(4)}
    for m in view.values():
        ends[str(m.queue_id)] = max(ends[str(m.queue_id)], m.queue_offset + 1)
    return ends


@pytest.fixture(scope="module")
def sent(mqaudit_cluster: Cluster) -> dict[str, dict[str, Any]]:
    """Every producer run into TOPIC: msgId -> the ack (queue and offset where the producer
    was told them), the run, and the message's expected body, KEYS and stored properties."""
    out: dict[str, dict[str, Any]] = {}
    for run, (args, props) in RUNS.items():
        for ack in produce(mqaudit_cluster.namesrv_addr, TOPIC, *args):
            assert ack["status"] in ("SEND_OK", "ONEWAY")
            i = ack["i"]
            keys = {"sync": f"sk-{i}", "async": f"ak-{i}", "ordered": f"ok-{i}"}.get(run)
            expect = {"UNIQ_KEY": ack["msgId"], **CLUSTER, **props}
            if keys:
                expect["KEYS"] = keys
            out[ack["msgId"]] = {**ack, "run": run, "body": f"body-{i}", "props": expect}
    assert len(out) == 18
    return out


def check_delivery(row: dict[str, Any], want: dict[str, Any], view: StoredMessage) -> None:
    props = dict(want["props"])
    if want["run"] == "delay":  # REAL_QID: the queue the producer picked
        props["REAL_QID"] = str(want["queueId"])
    assert (row["topic"], row["body"], stored(row)) == (TOPIC, want["body"], props)
    assert (row.get("keys"), row.get("tags")) == (props.get("KEYS"), props.get("TAGS"))
    assert row["reconsumeTimes"] == 0
    where = (row["queueId"], row["queueOffset"])
    assert where == (view.queue_id, view.queue_offset)  # as mqaudit's broker serves it
    assert (view.body.decode(), view.properties) == (want["body"], props)
    if want["run"] == "delay":
        assert row["queueId"] == want["queueId"]
    elif want["run"] != "oneway":
        assert where == (want["queueId"], want["queueOffset"])  # as the producer was told
    if want["run"] == "ordered":
        assert row["queueId"] == want["i"] % 2  # the MessageQueueSelector's choice


def test_every_send_mode_reaches_the_push_consumer_as_sent(
    mqaudit_cluster: Cluster, sent: dict[str, dict[str, Any]]
) -> None:
    got = consume(mqaudit_cluster.namesrv_addr, "j_push", TOPIC, "--expect", "18")
    view = broker_view(mqaudit_cluster, TOPIC)
    assert Counter(r["msgId"] for r in got) == Counter(
        list(sent)
    )  # each once, none missing or extra
    assert set(view) == set(sent)
    for row in got:
        check_delivery(row, sent[row["msgId"]], view[row["msgId"]])
    ordered = [r for r in got if sent[r["msgId"]]["run"] == "ordered"]
    ordered.sort(key=lambda r: int(sent[r["msgId"]]["i"]))
    for q in (0, 1):  # within its queue, the ordered run in send order
        offsets = [r["queueOffset"] for r in ordered if r["queueId"] == q]
        assert offsets == sorted(offsets)
    # The offsets the client committed (UPDATE_CONSUMER_OFFSET, then at shutdown) are every
    # queue's end, in consumerOffset.json and in what mqaudit's own admin reads.
    ends = queue_ends(view)
    assert committed(mqaudit_cluster, f"{TOPIC}@j_push", ends) == ends
    rows = consume_stats(mqaudit_cluster, "j_push", TOPIC)
    assert {str(r["queueId"]): (r["consumerOffset"], r["brokerOffset"]) for r in rows} == {
        q: (end, end) for q, end in ends.items()
    }


def consume_stats(cluster: Cluster, group: str, topic: str) -> list[dict[str, Any]]:
    """GET_CONSUME_STATS as mqaudit's admin reads it."""

    async def run() -> list[dict[str, Any]]:
        c = RawClient()
        try:
            fields = {"consumerGroup": group, "topic": topic}
            resp = await c.call(cluster.addr(f"{BROKER}-master"), C.GET_CONSUME_STATS, fields)
            rows: list[dict[str, Any]] = decode_json(resp.body, "consume stats")["offsetTable"]
            return rows
        finally:
            await c.close()

    return asyncio.run(run())


def test_broadcasting_delivers_everything_and_commits_nothing_to_the_broker(
    mqaudit_cluster: Cluster, sent: dict[str, dict[str, Any]]
) -> None:
    args = ("--model", "broadcasting", "--expect", "18")
    got = consume(mqaudit_cluster.namesrv_addr, "j_bcast", TOPIC, *args)
    view = broker_view(mqaudit_cluster, TOPIC)
    assert Counter(r["msgId"] for r in got) == Counter(list(sent))
    for row in got:
        check_delivery(row, sent[row["msgId"]], view[row["msgId"]])
    path = mqaudit_cluster.store_dir(f"{BROKER}-master") / "config" / "consumerOffset.json"
    assert f"{TOPIC}@j_bcast" not in json.loads(path.read_text())["offsetTable"]


def test_a_tag_subscription_gets_exactly_its_tags(
    mqaudit_cluster: Cluster, sent: dict[str, dict[str, Any]]
) -> None:
    args = ("--sub", "TagB || TagC", "--expect", "5", "--idle-ms", "5000")
    got = consume(mqaudit_cluster.namesrv_addr, "j_tags", TOPIC, *args)
    want = {m for m, s in sent.items() if s["run"] in ("async", "oneway")}
    assert Counter(r["msgId"] for r in got) == Counter(list(want))
    view = broker_view(mqaudit_cluster, TOPIC)
    for row in got:
        check_delivery(row, sent[row["msgId"]], view[row["msgId"]])


def test_the_lite_pull_consumer_commits_what_it_polled(
    mqaudit_cluster: Cluster, sent: dict[str, dict[str, Any]]
) -> None:
    rows = java(
        "LitePullConsumer", "--namesrv", mqaudit_cluster.namesrv_addr, "--group", "j_lite",
        "--topic", TOPIC, "--expect", "18", "--auto-commit", "false",
    )  # fmt: skip
    got = [r for r in rows if "msgId" in r]
    view = broker_view(mqaudit_cluster, TOPIC)
    assert Counter(r["msgId"] for r in got) == Counter(list(sent))
    for row in got:
        check_delivery(row, sent[row["msgId"]], view[row["msgId"]])
    ends = queue_ends(view)
    assert committed(mqaudit_cluster, f"{TOPIC}@j_lite", ends) == ends


def test_reconsume_later_goes_to_retry_then_to_the_dead_letter_queue(
    mqaudit_cluster: Cluster,
) -> None:
    ns = mqaudit_cluster.namesrv_addr
    acks = {a["i"]: a for a in produce(ns, "JRetry", "--count", "3", "--keys", "rk")}
    # The group's retry topic exists (created by a heartbeat) before the Java consumer starts:
    # the client asks for its route while starting and then only every 30 s, a race that the
    # real broker can lose too.
    heartbeat(mqaudit_cluster, "j_retry", "JRetry")
    args = ("--fail", "body-1", "--max-reconsume", "2", "--idle-ms", "6000")
    got = consume(ns, "j_retry", "JRetry", *args)
    failing = acks[1]["msgId"]
    assert Counter(r["msgId"] for r in got) == Counter(
        {acks[0]["msgId"]: 1, acks[2]["msgId"]: 1, failing: 3}
    )
    tries = [r for r in got if r["msgId"] == failing]
    assert [(r["reconsumeTimes"], r["answer"]) for r in tries] == [
        (n, "RECONSUME_LATER") for n in range(3)
    ]
    first, *retries = tries
    assert (first["queueId"], first["queueOffset"]) == (acks[1]["queueId"], acks[1]["queueOffset"])
    for n, r in enumerate(retries):  # %RETRY%j_retry's one queue, shown under the real topic
        assert (r["topic"], r["body"], r.get("keys"), r["queueId"], r["queueOffset"]) == (
            "JRetry", "body-1", "rk-1", 0, n,
        )  # fmt: skip
        props = stored(r)
        assert props["RETRY_TOPIC"] == "JRetry" and props["UNIQ_KEY"] == failing
        assert props["ORIGIN_MESSAGE_ID"] == acks[1]["offsetMsgId"]
    # After maxReconsumeTimes (2) the third failure is a dead letter: one, in %DLQ%j_retry.
    dead = query(mqaudit_cluster, "%DLQ%j_retry", failing)
    assert [(m.body, m.uniq_key, m.keys, m.properties.get("RETRY_TOPIC")) for m in dead] == [
        (b"body-1", failing, "rk-1", "JRetry")
    ]
    ends = {str(q): 0 for q in range(4)}
    for a in acks.values():
        ends[str(a["queueId"])] = max(ends[str(a["queueId"])], a["queueOffset"] + 1)
    assert committed(mqaudit_cluster, "JRetry@j_retry", ends) == ends
    retry = committed(mqaudit_cluster, "%RETRY%j_retry@j_retry", {"0": 2})
    assert retry == {"0": 2}  # both retries consumed


def heartbeat(cluster: Cluster, group: str, topic: str) -> None:
    data = HeartbeatData("interop-setup", consumers=[ConsumerData(group, subscriptions=[
        SubscriptionData(topic)])])  # fmt: skip

    async def run() -> None:
        c = RawClient()
        try:
            resp = await c.call(cluster.addr(f"{BROKER}-master"), C.HEART_BEAT, body=data.encode())
            assert resp.code == R.SUCCESS
        finally:
            await c.close()

    asyncio.run(run())


def query(cluster: Cluster, topic: str, key: str) -> list[StoredMessage]:
    async def run() -> list[StoredMessage]:
        c = RawClient()
        try:
            h = QueryMessageRequestHeader(topic, key)
            resp = await c.call(cluster.addr(f"{BROKER}-master"), C.QUERY_MESSAGE, h.fields())
            return decode_units(resp.body) if resp.code == R.SUCCESS else []
        finally:
            await c.close()

    return asyncio.run(run())


ACL_ACCOUNTS = {
    "accounts": [
        {"accessKey": "adminKey01", "secretKey": "adminSecret01", "admin": True},
        {"accessKey": "javaProducer", "secretKey": "producerSecret1",
         "defaultTopicPerm": "DENY", "defaultGroupPerm": "DENY", "topicPerms": ["JAcl=PUB"]},
        {"accessKey": "javaConsumer", "secretKey": "consumerSecret1",
         "defaultTopicPerm": "DENY", "defaultGroupPerm": "DENY", "topicPerms": ["JAcl=SUB"],
         "groupPerms": ["j_acl=SUB"]},
    ]
}  # fmt: skip


def test_acl_with_the_official_rpc_hook(interop_classpath: str, tmp_path: Path) -> None:
    acl = tmp_path / "acl.json"
    acl.write_text(json.dumps(ACL_ACCOUNTS))
    data = tmp_path / "acl-cluster"
    with running_cluster(
        data, name_servers=1, slaves=False, acl=acl, settings=MQAUDIT_SETTINGS
    ) as cluster:
        ns = cluster.namesrv_addr
        right = ("--access-key", "javaProducer", "--secret-key", "producerSecret1")
        acks = produce(ns, "JAcl", "--count", "3", *right)
        assert [a["status"] for a in acks] == ["SEND_OK"] * 3
        for creds in (
            ("--access-key", "javaProducer", "--secret-key", "wrongSecret"),
            ("--access-key", "javaConsumer", "--secret-key", "consumerSecret1"),  # no PUB
        ):
            rows = java("Producer", "--namesrv", ns, "--topic", "JAcl", "--count", "1", *creds)
            assert rows[-1]["failed"] == 1 and "still failed" in rows[0]["error"]
        sub = ("--access-key", "javaConsumer", "--secret-key", "consumerSecret1")
        got = consume(ns, "j_acl", "JAcl", "--expect", "3", *sub)
        assert sorted((r["msgId"], r["body"]) for r in got) == sorted(
            (a["msgId"], f"body-{a['i']}") for a in acks
        )
        view = broker_view(cluster, "JAcl", ("adminKey01", "adminSecret01"))
        assert set(view) == {a["msgId"] for a in acks}
