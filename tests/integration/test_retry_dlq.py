"""Delay levels, consume retry and dead letters on a real master/slave pair, with the delay
levels scaled by 0.1 (level 1 = 100 ms, 2 = 500 ms, 3 = 1 s, 4 = 3 s).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_runtime.common.message import (
    DELAY,
    ORIGIN_MESSAGE_ID,
    RECONSUME_TIME,
    RETRY_TOPIC,
    UNIQ_KEY,
    StoredMessage,
)
from broker_runtime.common.topics import SCHEDULE_TOPIC
from broker_runtime.remoting.bodies import (
    ConsumerData,
    HeartbeatData,
    SubscriptionData,
    TopicRouteData,
    decode_json,
)
from broker_runtime.remoting.headers import (
    ConsumerSendMsgBackRequestHeader,
    QueryMessageRequestHeader,
    ViewMessageRequestHeader,
)
from broker_runtime.remoting.protocol import RequestCode as C
from broker_runtime.remoting.protocol import ResponseCode as R
from broker_runtime.store.consume_queue import ENTRY
from tests.integration.cluster_fixtures import Cluster, RawClient, decode_units, running_cluster

pytestmark = pytest.mark.integration
SETTINGS = {"store.delay_time_scale": "0.1", "delay_offset_persist_interval_ms": "200"}
MASTER, SLAVE = "broker-a-master", "broker-a-slave"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(
        tmp_path_factory.mktemp("retry") / "c", name_servers=1, settings=SETTINGS
    ) as c:
        yield c


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


async def pull_one(
    c: RawClient, addr: str, topic: str, queue: int, offset: int, timeout_s: float = 10
) -> tuple[StoredMessage, float]:
    """The message at `offset`, long-polling until it is there; and when it came (monotonic)."""
    deadline = time.monotonic() + timeout_s
    while True:
        resp, msgs = await c.pull(addr, topic, queue, offset, suspend_ms=1000)
        if msgs:
            return msgs[0], time.monotonic()
        # TOPIC_NOT_EXIST: a slave copies its master's topics every second; OFFSET_MOVED:
        # `offset` is more than one past the queue's end for now.
        waiting = (
            R.PULL_NOT_FOUND,
            R.PULL_RETRY_IMMEDIATELY,
            R.TOPIC_NOT_EXIST,
            R.PULL_OFFSET_MOVED,
        )
        assert resp.code in waiting, (resp.code, resp.remark)
        assert time.monotonic() < deadline, f"nothing at {topic}/{queue}@{offset}"
        if resp.code in (R.TOPIC_NOT_EXIST, R.PULL_OFFSET_MOVED):
            await asyncio.sleep(0.1)


async def query(c: RawClient, addr: str, topic: str, key: str) -> list[StoredMessage]:
    h = QueryMessageRequestHeader(topic, key)
    resp = await c.call(addr, C.QUERY_MESSAGE, h.fields())
    return decode_units(resp.body) if resp.code == R.SUCCESS else []


async def send_back(
    c: RawClient, addr: str, failed: StoredMessage, group: str, **kw: int
) -> tuple[int, str | None]:
    h = ConsumerSendMsgBackRequestHeader(
        failed.phys_offset, group, origin_msg_id=failed.uniq_key, origin_topic=failed.topic, **kw
    )
    resp = await c.call(addr, C.CONSUMER_SEND_MSG_BACK, h.fields())
    return resp.code, resp.remark


def test_delayed_message_arrives_after_its_scaled_delay(cluster: Cluster) -> None:
    master, slave = cluster.addr(MASTER), cluster.addr(SLAVE)

    async def t() -> None:
        c = RawClient()
        try:
            r = await c.send(master, "Delayed", b"later", 1, {UNIQ_KEY: "D1", DELAY: "2"})
            sent = time.monotonic()
            assert r.code == R.SUCCESS, r.remark
            _, msgs = await c.pull(master, "Delayed", 1, 0)
            assert not msgs, "delivered before its delay"
            msg, came = await pull_one(c, master, "Delayed", 1, 0)
            assert came - sent >= 0.45
            assert (msg.body, msg.uniq_key, msg.topic) == (b"later", "D1", "Delayed")
            assert DELAY not in msg.properties
            [scheduled] = await query(c, master, SCHEDULE_TOPIC, "D1")
            assert (scheduled.queue_id, scheduled.properties[DELAY]) == (1, "2")
            assert msg.store_timestamp - scheduled.store_timestamp >= 500
            # The level queue's file holds the delivery time as the entry's tag code.
            cq = cluster.store_dir(MASTER) / "consumequeue" / SCHEDULE_TOPIC / "1"
            entries = list(ENTRY.iter_unpack(next(cq.iterdir()).read_bytes()[: ENTRY.size]))
            assert entries[0] == (scheduled.phys_offset, scheduled.total_size,
                                  scheduled.store_timestamp + 500)  # fmt: skip
            # The slave has the delivered copy by replication (it schedules nothing itself).
            copy, _ = await pull_one(c, slave, "Delayed", 1, 0)
            assert (copy.phys_offset, copy.uniq_key) == (msg.phys_offset, "D1")
            # A level past the table is the last one; a DELAY that is no number is refused.
            bad = await c.send(master, "Delayed", b"x", 1, {DELAY: "soon"})
            assert bad.code == R.MESSAGE_ILLEGAL and "DELAY" in (bad.remark or "")
            direct = await c.send(master, SCHEDULE_TOPIC, b"x", 0)
            assert direct.code == R.NO_PERMISSION
        finally:
            await c.close()

    run(t())


def test_send_back_lands_in_retry_after_its_delay_with_lineage(cluster: Cluster) -> None:
    master, ns = cluster.addr(MASTER), cluster.namesrv_addr.split(";")[0]

    async def t() -> None:
        c = RawClient()
        try:
            consumer = ConsumerData("GR", subscriptions=[SubscriptionData("RB")])
            hb = HeartbeatData("retry-client", consumers=[consumer])
            assert (await c.call(master, C.HEART_BEAT, body=hb.encode())).code == R.SUCCESS
            assert (await c.send(master, "RB", b"fails once", 0, {UNIQ_KEY: "R1"})).code == 0
            failed, _ = await pull_one(c, master, "RB", 0, 0)
            code, remark = await send_back(c, master, failed, "GR")
            backed = time.monotonic()
            assert code == R.SUCCESS, remark
            resp, msgs = await c.pull(master, "%RETRY%GR", 0, 0, group="GR")
            assert resp.code == R.PULL_NOT_FOUND and not msgs
            retry, came = await pull_one(c, master, "%RETRY%GR", 0, 0)
            assert came - backed >= 0.9  # level 3 + 0 reconsumes = 10 s * 0.1
            assert retry.topic == "%RETRY%GR" and retry.body == b"fails once"
            assert retry.uniq_key == "R1" and retry.reconsume_times == 1
            assert retry.properties[RETRY_TOPIC] == "RB"
            assert retry.properties[ORIGIN_MESSAGE_ID] == failed.msg_id
            # The retry topic is routed, so consumers find it through the name servers.
            deadline = time.monotonic() + 10
            while True:
                resp = await c.call(ns, C.GET_ROUTEINFO_BY_TOPIC, {"topic": "%RETRY%GR"})
                if resp.code == R.SUCCESS:
                    route = TopicRouteData.decode(resp.body)
                    assert [q.read_queue_nums for q in route.queue_datas] == [1]
                    break
                assert time.monotonic() < deadline, resp.remark
                await asyncio.sleep(0.2)
            # An offset with no message behind it is an error, not a silent success.
            failed.phys_offset = 10**12
            assert (await send_back(c, master, failed, "GR"))[0] == R.SYSTEM_ERROR
        finally:
            await c.close()

    run(t())


def test_past_max_reconsume_times_a_message_is_dead_lettered(cluster: Cluster) -> None:
    master = cluster.addr(MASTER)

    async def t() -> None:
        c = RawClient()
        try:
            assert (await c.send(master, "DL", b"always fails", 0, {UNIQ_KEY: "X1"})).code == 0
            first, _ = await pull_one(c, master, "DL", 0, 0)
            assert (await send_back(c, master, first, "GD", delay_level=1,
                                    max_reconsume_times=1))[0] == R.SUCCESS  # fmt: skip
            retry, _ = await pull_one(c, master, "%RETRY%GD", 0, 0)
            assert retry.reconsume_times == 1
            assert (await send_back(c, master, retry, "GD", max_reconsume_times=1))[0] == 0
            [dead] = await _eventually(lambda: query(c, master, "%DLQ%GD", "X1"))
            assert (dead.topic, dead.reconsume_times, dead.body) == ("%DLQ%GD", 2, b"always fails")
            assert dead.properties[RETRY_TOPIC] == "DL"
            assert dead.properties[ORIGIN_MESSAGE_ID] == first.msg_id
            assert DELAY not in dead.properties
            # Not delivered to consumers: the DLQ is write-only ...
            resp, msgs = await c.pull(master, "%DLQ%GD", 0, 0, group="GD")
            assert resp.code == R.NO_PERMISSION and not msgs
            # ... but found by id, and its files are there for the pipeline.
            view = await c.call(master, C.VIEW_MESSAGE_BY_ID,
                                ViewMessageRequestHeader(dead.phys_offset).fields())  # fmt: skip
            assert decode_units(view.body)[0].uniq_key == "X1"
            topics = json.loads((cluster.store_dir(MASTER) / "config" / "topics.json").read_text())
            assert topics["topicConfigTable"]["%DLQ%GD"]["perm"] == 2
            assert (cluster.store_dir(MASTER) / "consumequeue" / "%DLQ%GD" / "0").is_dir()
            # A client's own retry send (send-back failed) past its limit is dead-lettered too.
            props = {UNIQ_KEY: "X2", RECONSUME_TIME: "3", "MAX_RECONSUME_TIMES": "3", DELAY: "5"}
            assert (await c.send(master, "%RETRY%GD", b"fallback", 0, props)).code == R.SUCCESS
            [dead2] = await _eventually(lambda: query(c, master, "%DLQ%GD", "X2"))
            assert dead2.reconsume_times == 3 and RECONSUME_TIME not in dead2.properties
        finally:
            await c.close()

    run(t())


async def _eventually(fetch: object, timeout: float = 10) -> list[StoredMessage]:
    deadline = time.monotonic() + timeout
    while True:
        found: list[StoredMessage] = await fetch()  # type: ignore[operator]
        if found or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.1)


def test_delay_offsets_survive_a_restart(cluster: Cluster) -> None:
    master, slave = cluster.addr(MASTER), cluster.addr(SLAVE)
    offsets_file = cluster.store_dir(MASTER) / "config" / "delayOffset.json"

    async def before() -> None:
        c = RawClient()
        try:
            for i in range(3):
                r = await c.send(master, "Resume", b"a", 0, {UNIQ_KEY: f"A{i}", DELAY: "1"})
                assert r.code == R.SUCCESS
            await pull_one(c, master, "Resume", 0, 2)
            resp = await c.call(master, C.GET_ALL_DELAY_OFFSET)
            assert decode_json(resp.body, "delay")["offsetTable"]["1"] >= 3
            # Due after the restart: level 6 is 12 s here (2 min at the tests' time scale), so
            # that a loaded machine's slow sync and stop do not make it due before the stop.
            r = await c.send(master, "Resume", b"b", 0, {UNIQ_KEY: "B", DELAY: "6"})
            assert r.code == R.SUCCESS
        finally:
            await c.close()

    run(before())
    slave_file = cluster.store_dir(SLAVE) / "config" / "delayOffset.json"
    wait_for(lambda: level_offset(slave_file, "1") >= 3)  # synced from the master
    cluster.stop(MASTER)
    assert level_offset(offsets_file, "1") >= 3 and level_offset(offsets_file, "6") == 0
    cluster.start(MASTER)

    async def after() -> None:
        c = RawClient()
        try:
            msg, _ = await pull_one(c, master, "Resume", 0, 3, timeout_s=30)
            assert msg.uniq_key == "B"
            await asyncio.sleep(0.5)  # nothing delivered twice after resuming
            _, msgs = await c.pull(master, "Resume", 0, 0)
            assert [m.uniq_key for m in msgs] == ["A0", "A1", "A2", "B"]
            copy, _ = await pull_one(c, slave, "Resume", 0, 3)
            assert copy.uniq_key == "B"
        finally:
            await c.close()

    run(after())
    wait_for(lambda: level_offset(offsets_file, "6") == 1)


def level_offset(path: Path, level: str) -> int:
    if not path.exists():
        return -1
    return int(json.loads(path.read_text())["offsetTable"].get(level, -1))


def wait_for(cond: object, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)
