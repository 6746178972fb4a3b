"""Producer and consumers against a real cluster (name servers and brokers as processes).

One cluster (two name servers, broker-a and broker-b with slaves) for this module; each
test has its own topic and group.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from broker_runtime.client.admin import MQAdmin
from broker_runtime.client.config import ClientConfig
from broker_runtime.client.consume_service import ConsumeContext
from broker_runtime.client.consumer_options import ConsumerOptions
from broker_runtime.client.lite_pull_consumer import LitePullConsumer
from broker_runtime.client.model import (
    ConsumeFromWhere,
    ConsumeStatus,
    MessageModel,
    ReceivedMessage,
    new_message,
)
from broker_runtime.client.producer import Producer
from broker_runtime.client.push_consumer import PushConsumer
from broker_runtime.client.rebalance import MessageQueue
from tests.integration.cluster_fixtures import Cluster, running_cluster

pytestmark = pytest.mark.integration

FIRST = ConsumeFromWhere.FIRST_OFFSET


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(
        tmp_path_factory.mktemp("clients") / "c", groups=("broker-a", "broker-b")
    ) as c:
        yield c


async def until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.05)


async def create_topic(ns: str, topic: str, queues: int = 4, brokers: int = 2) -> None:
    """Create `topic` on every master and wait until a name server routes it to all."""
    async with MQAdmin(ns) as admin:
        await admin.topic_create(topic, queues)
        for _ in range(200):
            route = await admin.api.get_route(topic)
            if route is not None and len(route.queue_datas) == brokers:
                return
            await asyncio.sleep(0.05)
    raise AssertionError(f"topic {topic} never routed to {brokers} brokers")


def config(ns: str, instance: str = "DEFAULT") -> ClientConfig:
    return ClientConfig(ns, instance_name=instance, persist_offset_interval_s=0.5)


def collector(into: list[ReceivedMessage]) -> Callable[..., Awaitable[ConsumeStatus]]:
    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeStatus:
        into.extend(msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    return listener


def owned(consumer: PushConsumer | LitePullConsumer, topic: str) -> set[MessageQueue]:
    return {mq for mq in consumer.pq_table if mq.topic == topic}


async def produce(ns: str, topic: str, n: int, **kw: object) -> list[str]:
    async with Producer(ns, "it-producer") as p:
        results = [await p.send(new_message(topic, f"m{i}".encode(), **kw)) for i in range(n)]  # type: ignore[arg-type]
    return [r.msg_id for r in results]


def test_two_consumers_of_a_group_consume_everything_exactly_once(cluster: Cluster) -> None:
    async def t() -> None:
        ns, topic, group = cluster.namesrv_addr, "EO", "g-eo"
        await create_topic(ns, topic)
        got1: list[ReceivedMessage] = []
        got2: list[ReceivedMessage] = []
        c1 = PushConsumer(
            config(ns), group, collector(got1), options=ConsumerOptions(consume_from=FIRST)
        )
        c2 = PushConsumer(
            config(ns), group, collector(got2), options=ConsumerOptions(consume_from=FIRST)
        )
        for c in (c1, c2):
            c.subscribe(topic)
        async with c1, c2:
            # The group settles: each member owns half of the 8 queues, none twice.
            await until(
                lambda: len(owned(c1, topic)) == len(owned(c2, topic)) == 4,
                30,
                "a balanced assignment",
            )
            assert not owned(c1, topic) & owned(c2, topic)
            sent = await produce(ns, topic, 400)
            await until(lambda: len(got1) + len(got2) >= 400, 60, "400 deliveries")
            await asyncio.sleep(1.0)  # room for a duplicate to show up
        ids = [m.msg_id for m in got1 + got2]
        assert sorted(ids) == sorted(sent)  # nothing lost, nothing twice
        assert got1 and got2
        assert {m.broker for m in got1 + got2} == {"broker-a", "broker-b"}
        async with MQAdmin(ns) as admin:
            rows = await admin.consumer_progress(group, topic)
        assert sum(r["brokerOffset"] for r in rows) == 400
        assert all(r["diff"] == 0 for r in rows)

    asyncio.run(t())


def test_broadcasting_gives_every_consumer_every_message(cluster: Cluster, tmp_path: Path) -> None:
    async def t() -> None:
        ns, topic, group = cluster.namesrv_addr, "BC", "g-bc"
        await create_topic(ns, topic)
        got = {"x": [], "y": []}  # type: dict[str, list[ReceivedMessage]]
        consumers = {
            name: PushConsumer(
                config(ns, name),
                group,
                collector(got[name]),
                options=ConsumerOptions(
                    message_model=MessageModel.BROADCASTING,
                    consume_from=FIRST,
                    offsets_dir=tmp_path,
                ),
            )
            for name in got
        }
        for c in consumers.values():
            c.subscribe(topic)
        async with consumers["x"], consumers["y"]:
            await until(lambda: all(len(owned(c, topic)) == 8 for c in consumers.values()), 30, "8")
            sent = await produce(ns, topic, 120)
            await until(lambda: all(len(v) >= 120 for v in got.values()), 60, "120 each")
            await asyncio.sleep(0.5)
        for v in got.values():
            assert sorted(m.msg_id for m in v) == sorted(sent)
        # The offsets live in a local file per consumer: a restart goes on from there.
        files = sorted(p.relative_to(tmp_path).parts[0] for p in tmp_path.rglob("offsets.json"))
        assert [f.split("@")[1] for f in files] == ["x", "y"]
        again: list[ReceivedMessage] = []
        x = PushConsumer(
            config(ns, "x"),
            group,
            collector(again),
            options=ConsumerOptions(
                message_model=MessageModel.BROADCASTING, consume_from=FIRST, offsets_dir=tmp_path
            ),
        )
        x.subscribe(topic)
        async with x:
            await until(lambda: len(owned(x, topic)) == 8, 30, "restart assignment")
            more = await produce(ns, topic, 10)
            await until(lambda: len(again) >= 10, 30, "10 new messages")
            await asyncio.sleep(0.5)
        assert sorted(m.msg_id for m in again) == sorted(more)

    asyncio.run(t())


def test_tag_expression_selects_messages(cluster: Cluster) -> None:
    async def t() -> None:
        ns, topic = cluster.namesrv_addr, "TAGS"
        await create_topic(ns, topic)
        wanted: list[str] = []
        for tag in ("TAGA", "TAGB", "TAGC", None):
            ids = await produce(ns, topic, 15, tags=tag)
            if tag in ("TAGA", "TAGB"):
                wanted += ids
        got: list[ReceivedMessage] = []
        c = PushConsumer(
            config(ns), "g-tags", collector(got), options=ConsumerOptions(consume_from=FIRST)
        )
        c.subscribe(topic, "TAGA || TAGB")
        async with c, MQAdmin(ns) as admin:
            await until(lambda: len(got) >= 30, 30, "30 tagged messages")

            async def lag() -> int:  # the group's offsets move past the filtered messages too
                rows = await admin.consumer_progress("g-tags", topic)
                return sum(r["diff"] for r in rows)

            for _ in range(100):
                if await lag() == 0:
                    break
                await asyncio.sleep(0.1)
            assert await lag() == 0
        assert sorted(m.msg_id for m in got) == sorted(wanted)
        assert Counter(m.tags for m in got) == {"TAGA": 15, "TAGB": 15}

    asyncio.run(t())


def test_ordered_send_keeps_a_key_in_one_queue_in_order(cluster: Cluster) -> None:
    async def t() -> None:
        ns, topic = cluster.namesrv_addr, "ORDERED"
        await create_topic(ns, topic)
        async with Producer(ns, "it-producer") as p:
            results = {
                key: [
                    await p.send_orderly(new_message(topic, f"{key}:{i}".encode()), key)
                    for i in range(40)
                ]
                for key in ("order-1", "order-2", "order-3")
            }
        queues = {key: {r.mq for r in rs} for key, rs in results.items()}
        assert all(len(q) == 1 for q in queues.values())
        got: list[ReceivedMessage] = []
        async with LitePullConsumer(
            config(ns), "g-ordered", options=ConsumerOptions(consume_from=FIRST), auto_commit=False
        ) as lite:
            await lite.assign({mq for q in queues.values() for mq in q})
            while len(got) < 120:
                batch = await lite.poll(10)
                assert batch, "poll timed out"
                got += batch
        for key in results:
            bodies = [m.body.decode() for m in got if m.body.startswith(key.encode())]
            assert bodies == [f"{key}:{i}" for i in range(40)]

    asyncio.run(t())


def test_lite_pull_commit_seek_and_committed(cluster: Cluster) -> None:
    async def t() -> None:
        ns, topic, group = cluster.namesrv_addr, "LITE", "g-lite"
        await create_topic(ns, topic)
        sent = await produce(ns, topic, 80)
        lite = LitePullConsumer(
            config(ns), group, options=ConsumerOptions(consume_from=FIRST), auto_commit=False
        )
        lite.subscribe(topic)
        async with lite:  # no auto commit: the seek below is not stored
            got: list[ReceivedMessage] = []
            while len(got) < 80:
                got += await lite.poll(10)
            assert sorted(m.msg_id for m in got) == sorted(sent)
            await lite.commit()
            mqs = sorted(owned(lite, topic))
            committed = {mq: await lite.committed(mq) for mq in mqs}
            maxima = {mq: await lite.max_offset(mq) for mq in mqs}
            assert committed == maxima
            # Seek back on one queue: its messages come again.
            mq = next(q for q in mqs if maxima[q] > 0)
            await lite.seek(mq, 0)
            again: list[ReceivedMessage] = []
            while len(again) < maxima[mq]:
                again += await lite.poll(10)
            assert {m.mq for m in again} == {mq}
            assert [m.queue_offset for m in again] == list(range(maxima[mq]))
        async with MQAdmin(ns) as admin:
            rows = await admin.consumer_progress(group, topic)
        assert all(r["diff"] == 0 for r in rows)

    asyncio.run(t())
