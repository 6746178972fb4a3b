"""Send and pull on a real master/slave pair: long polling, tags, batches, offsets, queries,
consumer membership and its notifications, statistics, reset by time, and bad requests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_runtime.common.message import offset_msg_id
from broker_runtime.remoting.bodies import (
    ConsumerData,
    HeartbeatData,
    SubscriptionData,
    decode_json,
    encode_batch,
)
from broker_runtime.remoting.command import RemotingCommand
from broker_runtime.remoting.connection import Connection
from broker_runtime.remoting.headers import (
    QueryMessageRequestHeader,
    QueueOffsetHeader,
    ResetOffsetRequestHeader,
    SendMessageRequestHeader,
    TopicHeader,
    TopicQueueHeader,
    UnregisterClientRequestHeader,
    ViewMessageRequestHeader,
)
from broker_runtime.remoting.protocol import RequestCode as C
from broker_runtime.remoting.protocol import ResponseCode as R
from tests.integration.cluster_fixtures import Cluster, RawClient, decode_units, running_cluster

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("sendpull") / "c", name_servers=1) as c:
        yield c


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


async def dispatched(c: RawClient, addr: str, topic: str, queue_id: int, n: int) -> None:
    """Wait until the queue holds `n` messages (the ConsumeQueue is built asynchronously)."""
    deadline = time.monotonic() + 10
    while True:
        r = await c.call(addr, C.GET_MAX_OFFSET, TopicQueueHeader(topic, queue_id).fields())
        if int(r.ext_fields["offset"]) >= n:
            return
        assert time.monotonic() < deadline, f"{topic}/{queue_id} never reached {n}"
        await asyncio.sleep(0.05)


def test_send_pull_long_polling_and_slave_reads(cluster: Cluster) -> None:
    master, slave = cluster.addr("broker-a-master"), cluster.addr("broker-a-slave")

    async def t() -> None:
        c = RawClient()
        try:
            r = await c.send(master, "LP", b"first", 2, {"KEYS": "k1", "UNIQ_KEY": "U1"})
            assert r.code == R.SUCCESS, r.remark
            assert r.ext_fields["queueOffset"] == "0"
            await dispatched(c, master, "LP", 2, 1)
            resp, msgs = await c.pull(master, "LP", 2, 0)
            assert resp.code == R.SUCCESS and [m.body for m in msgs] == [b"first"]
            assert resp.ext_fields["nextBeginOffset"] == "1"
            # Nothing new: without suspension PULL_NOT_FOUND at once.
            resp, _ = await c.pull(master, "LP", 2, 1)
            assert resp.code == R.PULL_NOT_FOUND
            # Long polling: held until the next message arrives, not until the timeout.
            t0 = time.monotonic()
            held = asyncio.ensure_future(c.pull(master, "LP", 2, 1, suspend_ms=8000))
            await asyncio.sleep(0.5)
            assert not held.done()
            assert (await c.send(master, "LP", b"second", 2)).code == R.SUCCESS
            resp, msgs = await held
            waited = time.monotonic() - t0
            assert resp.code == R.SUCCESS and [m.body for m in msgs] == [b"second"]
            assert 0.4 < waited < 4, waited
            # And a held pull that nothing answers comes back at its timeout.
            t0 = time.monotonic()
            resp, _ = await c.pull(master, "LP", 2, 2, suspend_ms=800)
            assert resp.code == R.PULL_NOT_FOUND and 0.7 < time.monotonic() - t0 < 3
            # Far past the end: the master corrects it (to the min offset while that is 0, as
            # RocketMQ's getMessage does for OFFSET_OVERFLOW_BADLY).
            resp, _ = await c.pull(master, "LP", 2, 50)
            assert resp.code == R.PULL_OFFSET_MOVED and resp.ext_fields["nextBeginOffset"] == "0"
            # The slave has both (replicated), serves pulls, refuses sends.
            deadline = time.monotonic() + 10
            while True:
                resp, msgs = await c.pull(slave, "LP", 2, 0)
                if resp.code == R.SUCCESS and len(msgs) == 2:
                    break
                assert time.monotonic() < deadline, (resp.code, resp.remark)
                await asyncio.sleep(0.2)
            assert [m.body for m in msgs] == [b"first", b"second"]
            r = await c.send(slave, "LP", b"no")
            assert r.code == R.SERVICE_NOT_AVAILABLE and "slave" in (r.remark or "")
            # A pull held on the slave wakes up when replication brings a message.
            held = asyncio.ensure_future(c.pull(slave, "LP", 2, 2, suspend_ms=8000))
            await asyncio.sleep(0.3)
            assert (await c.send(master, "LP", b"third", 2)).code == R.SUCCESS
            resp, msgs = await held
            assert [m.body for m in msgs] == [b"third"]
        finally:
            await c.close()

    run(t())


def test_tags_batches_and_queries(cluster: Cluster) -> None:
    master = cluster.addr("broker-a-master")

    async def t() -> None:
        c = RawClient()
        try:
            for i, tag in enumerate(["TAGA", "TAGB", "TAGC", "TAGA"]):
                r = await c.send(
                    master, "Tags", f"m{i}".encode(), 0, {"TAGS": tag, "KEYS": f"key{i}"}
                )
                assert r.code == R.SUCCESS
            await dispatched(c, master, "Tags", 0, 4)
            resp, msgs = await c.pull(master, "Tags", 0, 0, subscription="TAGA || TAGC")
            assert [m.body for m in msgs] == [b"m0", b"m2", b"m3"]
            assert resp.ext_fields["nextBeginOffset"] == "4"
            # Nothing matches: RETRY_IMMEDIATELY with the offset moved past what was scanned.
            resp, msgs = await c.pull(master, "Tags", 0, 0, subscription="NONE")
            assert resp.code == R.PULL_RETRY_IMMEDIATELY and not msgs
            assert resp.ext_fields["nextBeginOffset"] == "4"
            # Batch: one request, contiguous queue offsets, comma-separated message ids.
            items = [(f"b{i}".encode(), {"UNIQ_KEY": f"B{i}"}, 0) for i in range(5)]
            h = SendMessageRequestHeader("pg", "Batch", 1, int(time.time() * 1000), batch=True)
            r = await c.call(master, C.SEND_BATCH_MESSAGE, h.fields(), encode_batch(items))
            assert r.code == R.SUCCESS, r.remark
            assert r.ext_fields["batchCount"] == "5" and len(r.ext_fields["msgId"].split(",")) == 5
            await dispatched(c, master, "Batch", 1, 5)
            _, msgs = await c.pull(master, "Batch", 1, 0)
            assert [m.queue_offset for m in msgs] == [0, 1, 2, 3, 4]
            assert [m.uniq_key for m in msgs] == [f"B{i}" for i in range(5)]
            # By id (the offset msg id carries the CommitLog offset) and by key.
            first = msgs[0]
            assert r.ext_fields["msgId"].split(",")[0] == offset_msg_id(
                first.store_host, first.phys_offset
            )
            v = await c.call(
                master, C.VIEW_MESSAGE_BY_ID, ViewMessageRequestHeader(first.phys_offset).fields()
            )
            assert v.code == R.SUCCESS and decode_units(v.body)[0].body == b"b0"
            await asyncio.sleep(0.3)  # the index is built by the dispatcher
            q = await c.call(
                master, C.QUERY_MESSAGE, QueryMessageRequestHeader("Tags", "key2").fields()
            )
            assert q.code == R.SUCCESS and [m.body for m in decode_units(q.body)] == [b"m2"]
            q = await c.call(
                master, C.QUERY_MESSAGE, QueryMessageRequestHeader("Tags", "nope").fields()
            )
            assert q.code == R.QUERY_NOT_FOUND
        finally:
            await c.close()

    run(t())


def test_offsets_membership_stats_and_reset(cluster: Cluster) -> None:
    master = cluster.addr("broker-a-master")
    notified: list[str] = []

    async def on_notify(cmd: RemotingCommand, conn: Connection) -> None:
        notified.append(cmd.ext_fields["consumerGroup"])

    async def t() -> None:
        c1, c2 = RawClient(), RawClient()
        c1.remoting.table.register(C.NOTIFY_CONSUMER_IDS_CHANGED, on_notify)
        try:
            before = int(time.time() * 1000)
            for i in range(6):
                assert (await c1.send(master, "Offs", f"o{i}".encode(), 0)).code == R.SUCCESS
            await dispatched(c1, master, "Offs", 0, 6)
            q = QueueOffsetHeader("G1", "Offs", 0)
            r = await c1.call(master, C.QUERY_CONSUMER_OFFSET, q.fields())
            # A new group on a queue that starts at 0, in memory: 0, as RocketMQ answers.
            assert r.code == R.SUCCESS and r.ext_fields["offset"] == "0"
            u = QueueOffsetHeader("G1", "Offs", 0, commit_offset=4)
            assert (await c1.call(master, C.UPDATE_CONSUMER_OFFSET, u.fields())).code == R.SUCCESS
            r = await c1.call(master, C.QUERY_CONSUMER_OFFSET, q.fields())
            assert r.code == R.SUCCESS and r.ext_fields["offset"] == "4"
            # Membership: heartbeats join, the first member hears of the second.
            sub = [SubscriptionData("Offs", "*")]
            for cid, client in (("client-1", c1), ("client-2", c2)):
                hb = HeartbeatData(cid, consumers=[ConsumerData("G1", subscriptions=sub)])
                assert (await client.call(master, C.HEART_BEAT, body=hb.encode())).code == 0
            lst = await c1.call(
                master, C.GET_CONSUMER_LIST_BY_GROUP, TopicHeader(consumer_group="G1").fields()
            )
            assert decode_json(lst.body, "x")["consumerIdList"] == ["client-1", "client-2"]
            await asyncio.sleep(0.3)
            assert notified.count("G1") >= 2  # its own join, then client-2's
            seen = len(notified)
            un = UnregisterClientRequestHeader("client-2", consumer_group="G1")
            assert (await c2.call(master, C.UNREGISTER_CLIENT, un.fields())).code == R.SUCCESS
            await asyncio.sleep(0.3)
            assert len(notified) > seen
            # Statistics as mqadmin shows them.
            st = await c1.call(master, C.GET_TOPIC_STATS_INFO, TopicHeader("Offs").fields())
            row = decode_json(st.body, "x")["offsetTable"][0]
            assert (row["queueId"], row["minOffset"], row["maxOffset"]) == (0, 0, 6)
            assert row["lastUpdateTimestamp"] >= before
            cs = await c1.call(master, C.GET_CONSUME_STATS, TopicHeader("Offs", "G1").fields())
            row = decode_json(cs.body, "x")["offsetTable"][0]
            assert (row["brokerOffset"], row["consumerOffset"]) == (6, 4)
            assert row["lastTimestamp"] >= before
            # Reset to a time before everything: offset 0; after everything: the end.
            for ts, want in ((before - 60_000, 0), (int(time.time() * 1000) + 60_000, 6)):
                h = ResetOffsetRequestHeader("G1", "Offs", ts)
                r = await c1.call(master, C.INVOKE_BROKER_TO_RESET_OFFSET, h.fields())
                assert r.code == R.SUCCESS, r.remark
                r = await c1.call(master, C.QUERY_CONSUMER_OFFSET, q.fields())
                assert r.ext_fields["offset"] == str(want)
            s = await c1.call(
                master, C.SEARCH_OFFSET_BY_TIMESTAMP, TopicQueueHeader("Offs", 0, before).fields()
            )
            assert s.ext_fields["offset"] == "0"
            mx = await c1.call(master, C.GET_MAX_OFFSET, TopicQueueHeader("Offs", 0).fields())
            assert mx.ext_fields["offset"] == "6"
        finally:
            await c1.close()
            await c2.close()

    run(t())
    # Offsets reach consumerOffset.json (persisted every second here, and at shutdown).
    path = cluster.store_dir("broker-a-master") / "config" / "consumerOffset.json"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if path.exists() and '"Offs@G1"' in path.read_text():
            break
        time.sleep(0.2)
    assert '"Offs@G1"' in path.read_text()


def test_bad_requests_get_clear_errors(cluster: Cluster) -> None:
    master = cluster.addr("broker-a-master")

    async def t() -> None:
        c = RawClient()
        try:
            r = await c.call(master, 4242)
            assert r.code == R.REQUEST_CODE_NOT_SUPPORTED
            r = await c.send(master, "bad/topic", b"x")
            assert r.code == R.SYSTEM_ERROR and "topic name" in (r.remark or "")
            r = await c.call(master, C.SEND_MESSAGE, {"topic": "T"}, b"x")
            assert r.code == R.SYSTEM_ERROR and "producerGroup" in (r.remark or "")
            r = await c.send(master, "T", b"x", queue_id=99)
            assert r.code == R.SYSTEM_ERROR and "queueId" in (r.remark or "")
            h = SendMessageRequestHeader("pg", "T", 0, 0, batch=True)
            r = await c.call(master, C.SEND_BATCH_MESSAGE, h.fields(), b"\x00\x00\x00\x30junk")
            assert r.code == R.SYSTEM_ERROR and "batch" in (r.remark or "")
            r = await c.send(master, "T", b"x" * (5 << 20))
            assert r.code == R.MESSAGE_ILLEGAL, r.remark
            r = await c.call(master, C.HEART_BEAT, body=b"{not json")
            assert r.code == R.SYSTEM_ERROR
            resp, _ = await c.pull(master, "NeverSent", 0, 0)
            assert resp.code == R.TOPIC_NOT_EXIST
            # And it still serves.
            assert (await c.send(master, "T", b"ok")).code == R.SUCCESS
        finally:
            await c.close()

    run(t())


def test_a_batch_over_the_message_size_limit_is_refused_whole(cluster: Cluster) -> None:
    """As RocketMQ's store: a batch body past maxMessageSize (here the 1 MiB segment's) is
    MESSAGE_ILLEGAL, though each message in it would fit; nothing of it is stored."""
    master = cluster.addr("broker-a-master")

    async def t() -> None:
        c = RawClient()
        try:
            items = [(bytes([i]) * (600 << 10), {}, 0) for i in range(2)]
            h = SendMessageRequestHeader("pg", "BigBatch", 0, 0, batch=True)
            r = await c.call(master, C.SEND_BATCH_MESSAGE, h.fields(), encode_batch(items))
            assert r.code == R.MESSAGE_ILLEGAL and "batch" in (r.remark or ""), r.remark
            resp, _ = await c.pull(master, "BigBatch", 0, 0)
            assert resp.code == R.TOPIC_NOT_EXIST or resp.ext_fields["maxOffset"] == "0"
            r = await c.call(master, C.SEND_BATCH_MESSAGE, h.fields(), encode_batch(items[:1]))
            assert r.code == R.SUCCESS, r.remark
        finally:
            await c.close()

    run(t())


def test_state_files_survive_a_clean_restart(cluster: Cluster, tmp_path: Path) -> None:
    master = cluster.addr("broker-a-master")
    cluster.stop("broker-a-master")
    store = cluster.store_dir("broker-a-master")
    assert not (store / "abort").exists()
    topics = decode_json((store / "config" / "topics.json").read_bytes(), "topics")
    assert {"LP", "Tags", "Batch", "Offs"} <= set(topics["topicConfigTable"])
    assert "%RETRY%G1" in topics["topicConfigTable"]
    groups = decode_json((store / "config" / "subscriptionGroup.json").read_bytes(), "groups")
    assert "G1" in groups["subscriptionGroupTable"]
    cluster.start("broker-a-master")

    async def t() -> None:
        c = RawClient()
        try:
            _, msgs = await c.pull(master, "LP", 2, 0)
            assert [m.body for m in msgs] == [b"first", b"second", b"third"]
        finally:
            await c.close()

    run(t())
