"""SQL92 subscriptions through a real cluster: the broker filters by message properties on
pull (its switch enable_property_filter on), tag subscriptions keep working beside them, and
what the broker refuses is said: the switch off, an expression that does not compile."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_runtime.client.admin import MQAdmin
from broker_runtime.client.consumer_options import ConsumerOptions
from broker_runtime.client.model import ReceivedMessage, new_message
from broker_runtime.client.producer import Producer
from broker_runtime.client.push_consumer import PushConsumer
from broker_runtime.common.sql_filter import SqlFilterError, compile_sql
from broker_runtime.offsets.consumer_filters import read_consumer_filters
from broker_runtime.remoting.protocol import RequestCode, ResponseCode
from tests.integration.cluster_fixtures import Cluster, RawClient, running_cluster
from tests.integration.test_clients_cluster import FIRST, collector, config, create_topic, until

pytestmark = pytest.mark.integration

EXPR = "color = 'red' AND n BETWEEN 10 AND 30 OR vip IS NOT NULL"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(
        tmp_path_factory.mktemp("sql") / "c",
        name_servers=1,
        slaves=False,
        settings={"enable_property_filter": "true"},
    ) as c:
        yield c


def properties(i: int) -> dict[str, str]:
    props = {"n": str(i), "color": "red" if i % 2 else "blue"}
    if i % 17 == 0:
        props["vip"] = "yes"
    return props


def expected(count: int, expression: str) -> set[str]:
    """The bodies the expression must deliver, decided by the same rules the broker uses."""
    sql = compile_sql(expression)
    return {f"m{i}" for i in range(count) if sql.matches({**properties(i), "TAGS": tag(i)})}


def tag(i: int) -> str:
    return "A" if i % 3 else "B"


async def produce(ns: str, topic: str, count: int) -> None:
    async with Producer(ns, "sql-producer") as p:
        for i in range(count):
            msg = new_message(topic, f"m{i}".encode(), tags=tag(i), properties=properties(i))
            await p.send(msg)


def test_a_sql92_subscription_gets_exactly_the_messages_its_expression_takes(
    cluster: Cluster,
) -> None:
    async def t() -> None:
        ns, topic = cluster.namesrv_addr, "SqlT"
        await create_topic(ns, topic, brokers=1)
        await produce(ns, topic, 60)
        by_sql: list[ReceivedMessage] = []
        by_tag: list[ReceivedMessage] = []
        by_tags_in_sql: list[ReceivedMessage] = []
        first = ConsumerOptions(consume_from=FIRST)
        consumers = [
            PushConsumer(config(ns, "s"), "g-sql", collector(by_sql), first),
            PushConsumer(config(ns, "t"), "g-tag", collector(by_tag), first),
            PushConsumer(config(ns, "u"), "g-tags-sql", collector(by_tags_in_sql), first),
        ]
        consumers[0].subscribe(topic, EXPR, "SQL92")
        consumers[1].subscribe(topic, "B")
        consumers[2].subscribe(topic, "TAGS = 'B' AND n > 30", "SQL92")
        want_sql, want_b = expected(60, EXPR), expected(60, "TAGS = 'B'")
        want_b30 = expected(60, "TAGS = 'B' AND n > 30")
        assert 0 < len(want_sql) < 60 and 0 < len(want_b30) < len(want_b) < 60
        async with consumers[0], consumers[1], consumers[2]:
            await until(
                lambda: (
                    (len(by_sql), len(by_tag), len(by_tags_in_sql))
                    == (len(want_sql), len(want_b), len(want_b30))
                ),
                60,
                "every matching message",
            )
            # Every queue read to its end by every group: nothing more is coming.
            async with MQAdmin(ns) as admin:
                for group in ("g-sql", "g-tag", "g-tags-sql"):
                    rows: list[dict[str, int]] = []
                    for _ in range(200):
                        rows = await admin.consumer_progress(group, topic)
                        if rows and all(r["diff"] == 0 for r in rows):
                            break
                        await asyncio.sleep(0.1)
                    assert rows and all(r["diff"] == 0 for r in rows), (group, rows)
        assert sorted(m.body.decode() for m in by_sql) == sorted(want_sql)
        assert sorted(m.body.decode() for m in by_tag) == sorted(want_b)
        assert sorted(m.body.decode() for m in by_tags_in_sql) == sorted(want_b30)
        # The broker kept the SQL92 subscriptions (not the tag one) in consumerFilter.json,
        # and marks them dead once their consumers left (written every persist interval).
        store = cluster.store_dir("broker-a-master")
        await until(
            lambda: (
                {(e.consumer_group, e.dead) for e in read_consumer_filters(store)}
                == {("g-sql", True), ("g-tags-sql", True)}
            ),
            30,
            "consumerFilter.json with both SQL92 groups, dead",
        )
        kept = {e.consumer_group: e for e in read_consumer_filters(store)}
        assert (kept["g-sql"].topic, kept["g-sql"].expression) == (topic, EXPR)
        assert kept["g-tags-sql"].expression_type == "SQL92"
        assert kept["g-sql"].client_version > 0 and kept["g-sql"].born_time > 0

    asyncio.run(t())


def test_a_bad_expression_is_refused_at_subscription_with_its_position(cluster: Cluster) -> None:
    consumer = PushConsumer(config(cluster.namesrv_addr), "g-bad", collector([]))
    with pytest.raises(SqlFilterError, match=r"unexpected '>' \(line 1, column 8\)"):
        consumer.subscribe("SqlT", "color >> 'red'", "SQL92")
    assert "SqlT" not in consumer.subscriptions


def check_client_body(expression: str, kind: str = "SQL92") -> bytes:
    sub = {"topic": "SqlT", "subString": expression, "expressionType": kind}
    return json.dumps({"clientId": "x", "group": "g", "subscriptionData": sub}).encode()


def test_the_broker_checks_a_clients_subscription_as_rocketmq_does(cluster: Cluster) -> None:
    async def t() -> None:
        raw = RawClient()
        addr = cluster.addr("broker-a-master")
        try:
            ok = await raw.call(addr, RequestCode.CHECK_CLIENT_CONFIG, body=check_client_body(EXPR))
            assert ok.code == ResponseCode.SUCCESS, ok.remark
            tags = check_client_body("A || B", "TAG")
            ok = await raw.call(addr, RequestCode.CHECK_CLIENT_CONFIG, body=tags)
            assert ok.code == ResponseCode.SUCCESS, ok.remark
            bad = await raw.call(
                addr, RequestCode.CHECK_CLIENT_CONFIG, body=check_client_body("n > 'x'")
            )
            assert bad.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
            assert "Value ''x'' cannot be compared. (line 1, column 1)" in (bad.remark or "")
        finally:
            await raw.close()

    asyncio.run(t())


def test_a_broker_with_the_property_filter_off_refuses_sql92(tmp_path: Path) -> None:
    async def t(c: Cluster) -> None:
        raw = RawClient()
        addr = c.addr("broker-a-master")
        try:
            resp = await raw.call(
                addr, RequestCode.CHECK_CLIENT_CONFIG, body=check_client_body(EXPR)
            )
            assert resp.code == ResponseCode.SYSTEM_ERROR
            assert resp.remark == "The broker does not support consumer to filter message by SQL92"
            fields = {
                "consumerGroup": "g", "topic": "SqlOff", "queueId": 0, "queueOffset": 0,
                "maxMsgNums": 32, "sysFlag": 4, "subscription": EXPR, "expressionType": "SQL92",
            }  # fmt: skip
            pulled = await raw.call(addr, RequestCode.PULL_MESSAGE, fields)
            assert pulled.code in (ResponseCode.SYSTEM_ERROR, ResponseCode.TOPIC_NOT_EXIST)
            await raw.send(addr, "SqlOff", b"x")
            pulled = await raw.call(addr, RequestCode.PULL_MESSAGE, fields)
            assert pulled.code == ResponseCode.SYSTEM_ERROR
            assert "does not support consumer to filter message by SQL92" in (pulled.remark or "")
        finally:
            await raw.close()

    with running_cluster(tmp_path / "c", name_servers=1, slaves=False) as c:
        asyncio.run(t(c))
