"""Consume retry on a live broker, client side: a failed message comes back from the group's
retry topic (its own topic restored) and is dead-lettered past max reconsume times; when
the broker will not take it back the client sends it to the retry topic itself, and when
that fails too consumes it again locally; orderly consumption retries in place. Ledger rows
written by these real clients are checked along the way.

Delay levels are scaled by 0.01 (level 3, the first retry, is 100 ms).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker_runtime.client.admin import MQAdmin
from broker_runtime.client.config import ClientConfig
from broker_runtime.client.consume_service import ConsumeContext
from broker_runtime.client.consumer_options import ConsumerOptions
from broker_runtime.client.ledger_hooks import ConsumerLedgerHooks, ProducerLedgerHooks
from broker_runtime.client.model import (
    ConsumeFromWhere,
    ConsumeStatus,
    ReceivedMessage,
    SendResult,
    new_message,
)
from broker_runtime.client.orderly import OrderlyPushConsumer
from broker_runtime.client.producer import Producer
from broker_runtime.client.push_consumer import PushConsumer
from broker_runtime.client.retry import ConsumeRetry
from broker_runtime.common.message import RETRY_TOPIC
from broker_runtime.common.topics import dlq_topic, retry_topic
from broker_runtime.ledger.consumer import ConsumerLedger
from broker_runtime.ledger.producer import ProducerLedger
from broker_runtime.remoting.bodies import LockBatchRequestBody, decode_lock_ok
from broker_runtime.remoting.command import request
from broker_runtime.remoting.protocol import RequestCode
from tests.integration.cluster_fixtures import Cluster, running_cluster

pytestmark = pytest.mark.integration
FIRST = ConsumeFromWhere.FIRST_OFFSET
Seen = list[tuple[str, str, str, int, int]]  # msg id, topic seen, topic pulled, offset, times


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    settings = {"store.delay_time_scale": "0.01"}
    with running_cluster(
        tmp_path_factory.mktemp("retry") / "c", name_servers=1, slaves=False, settings=settings
    ) as c:
        yield c


def config(ns: str) -> ClientConfig:
    return ClientConfig(ns, persist_offset_interval_s=0.5)


async def until(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def create(ns: str, topic: str, queues: int = 2) -> None:
    async with MQAdmin(ns) as admin:
        await admin.topic_create(topic, queues)
        for _ in range(100):
            if await admin.api.get_route(topic) is not None:
                return
            await asyncio.sleep(0.05)
    raise AssertionError(f"{topic} not routed")


async def produce(ns: str, topic: str, n: int, ledger: Path | None = None) -> list[SendResult]:
    p = Producer(ns, "retry-it")
    hooks = ProducerLedgerHooks(ProducerLedger.open(ledger)).attach(p) if ledger else None
    await p.start()
    try:
        return [await p.send(new_message(topic, f"m{i}".encode())) for i in range(n)]
    finally:
        await p.shutdown()
        if hooks is not None:
            hooks.close()


def recorder(seen: Seen, fail: Any) -> Any:
    """A listener noting each delivery; `fail(msg)` says whether to fail it (and how)."""

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeStatus | None:
        m = msgs[0]
        seen.append((m.msg_id, m.topic, ctx.mq.topic, m.queue_offset, m.reconsume_times))
        how = fail(m)
        if how == "raise":
            raise RuntimeError("listener failed")
        if how == "none":
            return None
        return ConsumeStatus.RECONSUME_LATER if how else ConsumeStatus.CONSUME_SUCCESS

    return listener


def test_retry_then_success_with_the_topic_restored_and_ledgers_written(
    cluster: Cluster, tmp_path: Path
) -> None:
    ns, topic, group = cluster.namesrv_addr, "RetryOk", "g-retry-ok"

    async def t() -> None:
        await create(ns, topic)
        sent = await produce(ns, topic, 10, tmp_path)
        seen: Seen = []
        c = PushConsumer(
            config(ns),
            group,
            recorder(seen, lambda m: m.reconsume_times == 0),
            options=ConsumerOptions(consume_from=FIRST),
        )
        hooks = ConsumerLedgerHooks(ConsumerLedger.open(tmp_path), group, c.client_id).attach(c)
        c.subscribe(topic)
        async with c:
            await until(lambda: len(seen) >= 20, 30, "20 deliveries")
            await asyncio.sleep(0.5)
        hooks.close()
        assert c.retry.sent_back == 10 and c.retry.sent_direct == 0
        by_id: dict[str, list[tuple[str, str, int]]] = {}
        for mid, seen_topic, pulled, _off, times in seen:
            by_id.setdefault(mid, []).append((seen_topic, pulled, times))
        assert sorted(by_id) == sorted(r.msg_id for r in sent)
        for deliveries in by_id.values():  # the listener always sees the first topic
            assert deliveries == [(topic, topic, 0), (topic, retry_topic(group), 1)]

        stubs = ProducerLedger.open(tmp_path)
        for r in sent:
            stub = stubs.get(r.msg_id)
            assert stub is not None and stub["status"] == "CONFIRMED"
            assert (stub["broker"], stub["queue_id"], stub["queue_offset"]) == (
                r.mq.broker, r.mq.queue_id, r.queue_offset,
            )  # fmt: skip
        stubs.close()
        log = ConsumerLedger.open(tmp_path)
        rows = [(r["msg_id"], r["topic"], r["reconsume_times"], r["outcome"]) for r in log.rows()]
        log.close()
        assert sorted(rows) == sorted(
            [(r.msg_id, topic, 0, "RECONSUME_LATER") for r in sent]
            + [(r.msg_id, retry_topic(group), 1, "CONSUMED") for r in sent]
        )

    asyncio.run(t())


def test_past_max_reconsume_times_the_message_is_dead_lettered(cluster: Cluster) -> None:
    ns, topic, group = cluster.namesrv_addr, "RetryDead", "g-retry-dead"
    ways = ["later", "raise", "none"]  # RECONSUME_LATER, an exception, None: all are failures

    async def t() -> None:
        await create(ns, topic)
        sent = await produce(ns, topic, 3)
        seen: Seen = []
        order = {r.msg_id: i for i, r in enumerate(sent)}
        c = PushConsumer(
            config(ns),
            group,
            recorder(seen, lambda m: ways[order[m.msg_id]]),
            options=ConsumerOptions(consume_from=FIRST),
            max_reconsume_times=2,
        )
        c.subscribe(topic)
        async with c:
            await until(lambda: len(seen) >= 9, 30, "3 deliveries of each message")
            async with MQAdmin(ns) as admin:
                for r in sent:
                    copies: list[ReceivedMessage] = []
                    for _ in range(100):
                        try:
                            copies = await admin.query_by_key(dlq_topic(group), r.msg_id)
                        except Exception:
                            copies = []
                        if copies:
                            break
                        await asyncio.sleep(0.1)
                    assert [m.reconsume_times for m in copies] == [3]
                    assert copies[0].properties[RETRY_TOPIC] == topic
            await asyncio.sleep(0.5)  # nothing more comes back
        assert sorted(times for *_, times in seen) == [0, 0, 0, 1, 1, 1, 2, 2, 2]

    asyncio.run(t())


class Unreachable(ConsumeRetry):
    """The broker refuses CONSUMER_SEND_MSG_BACK; with `direct_too`, retry sends as well."""

    direct_too = False

    async def _send_msg_back(self, msg: ReceivedMessage, delay_level: int) -> None:
        raise ConnectionError("send-back refused (test)")

    async def send_to_retry_topic(self, msg: ReceivedMessage, delay_level: int) -> None:
        if self.direct_too:
            raise ConnectionError("retry send refused (test)")
        await super().send_to_retry_topic(msg, delay_level)


def consumer_with(ns: str, group: str, seen: Seen, direct_too: bool) -> PushConsumer:
    c = PushConsumer(
        config(ns),
        group,
        recorder(seen, lambda m: m.reconsume_times == 0),
        options=ConsumerOptions(consume_from=FIRST),
    )
    retry = Unreachable(c.instance, c.config, group, 16, c.rebalance_now)
    retry.direct_too = direct_too
    c.retry = retry
    return c


def test_a_failed_send_back_falls_back_to_sending_to_the_retry_topic(cluster: Cluster) -> None:
    ns, topic, group = cluster.namesrv_addr, "RetryDirect", "g-retry-direct"

    async def t() -> None:
        await create(ns, topic)
        sent = await produce(ns, topic, 4)
        seen: Seen = []
        c = consumer_with(ns, group, seen, direct_too=False)
        c.subscribe(topic)
        async with c:
            await until(lambda: len(seen) >= 8, 30, "8 deliveries")
        assert c.retry.sent_direct == 4 and c.retry.sent_back == 0
        again = sorted((mid, pulled, times) for mid, _, pulled, _, times in seen if times)
        assert again == sorted((r.msg_id, retry_topic(group), 1) for r in sent)

    asyncio.run(t())


def test_when_nothing_takes_it_back_the_message_is_consumed_again_locally(
    cluster: Cluster,
) -> None:
    ns, topic, group = cluster.namesrv_addr, "RetryLocal", "g-retry-local"

    async def t() -> None:
        await create(ns, topic)
        sent = await produce(ns, topic, 4)
        seen: Seen = []
        c = consumer_with(ns, group, seen, direct_too=True)
        c.subscribe(topic)
        async with c:
            assert c.service is not None
            c.service.retry_delay_s = 0.2
            await until(lambda: len(seen) >= 8, 30, "8 deliveries")
            await asyncio.sleep(0.5)
        assert c.retry.failed == 4
        # The same stored message again, from the same queue position: a duplicate delivery.
        for r in sent:
            mine = [(pulled, off, times) for mid, _, pulled, off, times in seen if mid == r.msg_id]
            assert mine == [(topic, r.queue_offset, 0), (topic, r.queue_offset, 1)]
        async with MQAdmin(ns) as admin:
            rows = await admin.consumer_progress(group, topic)
        assert sum(row["consumerOffset"] for row in rows) == 4  # committed once consumed

    asyncio.run(t())


def test_orderly_consumption_retries_in_place_and_holds_the_queue_lock(cluster: Cluster) -> None:
    ns, topic, group = cluster.namesrv_addr, "Orderly", "g-orderly"

    async def t() -> None:
        await create(ns, topic, queues=2)
        async with Producer(ns, "orderly-it") as p:
            sent = [await p.send_orderly(new_message(topic, f"o{i}".encode()), i % 2)
                    for i in range(20)]  # fmt: skip
        flaky, doomed = sent[6].msg_id, sent[9].msg_id
        seen: Seen = []

        def fail(m: ReceivedMessage) -> bool:
            return (m.msg_id == flaky and m.reconsume_times < 2) or m.msg_id == doomed

        c = OrderlyPushConsumer(
            config(ns),
            group,
            recorder(seen, fail),
            options=ConsumerOptions(consume_from=FIRST),
            suspend_ms=200,
            max_reconsume_times=2,
        )
        c.subscribe(topic)
        async with c, MQAdmin(ns) as admin:
            await until(lambda: len({s[0] for s in seen}) == 20 and c.consumed == 20, 30, "all 20")
            # Another client cannot take a queue this consumer holds.
            addr = (await admin.masters())["broker-a"]
            body = LockBatchRequestBody(group, "someone-else", [(topic, "broker-a", 0)]).encode()
            resp = await admin.api.invoke(addr, request(RequestCode.LOCK_BATCH_MQ, body=body))
            assert decode_lock_ok(resp.body) == []
        for q in (0, 1):
            ids = {r.msg_id for r in sent if r.mq.queue_id == q}
            in_queue = [(s[0], s[4]) for s in seen if s[0] in ids]
            expected = []
            for r in (r for r in sent if r.mq.queue_id == q):
                tries = 3 if r.msg_id in (flaky, doomed) else 1
                expected += [(r.msg_id, n) for n in range(tries)]
            assert in_queue == expected  # queue order, each failure retried before moving on
        assert c.suspended == 4
        async with MQAdmin(ns) as admin:
            rows = await admin.consumer_progress(group, topic)
            assert [row["consumerOffset"] for row in rows] == [10, 10]
            copies = []
            for _ in range(100):
                try:
                    copies = await admin.query_by_key(dlq_topic(group), doomed)
                except Exception:
                    copies = []
                if copies:
                    break
                await asyncio.sleep(0.1)
            assert len(copies) == 1  # past max reconsume times: dead-lettered, queue moved on

    asyncio.run(t())


def test_a_queue_moves_between_orderly_consumers_in_order_and_once(cluster: Cluster) -> None:
    ns, topic, group = cluster.namesrv_addr, "OrderlyMove", "g-orderly-move"

    async def t() -> None:
        await create(ns, topic, queues=4)
        seen: list[tuple[str, str, int, int, float]] = []  # consumer, msg id, queue, offset, t

        def slow(name: str) -> Any:
            async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeStatus:
                m = msgs[0]
                seen.append((name, m.msg_id, m.queue_id, m.queue_offset, time.monotonic()))
                await asyncio.sleep(0.02)
                return ConsumeStatus.CONSUME_SUCCESS

            return listener

        c1 = OrderlyPushConsumer(
            config(ns), group, slow("c1"), options=ConsumerOptions(consume_from=FIRST)
        )
        c2 = OrderlyPushConsumer(
            config(ns), group, slow("c2"), options=ConsumerOptions(consume_from=FIRST)
        )
        for c in (c1, c2):
            c.subscribe(topic)
        async with c1:
            async with Producer(ns, "orderly-move") as p:
                sent = [await p.send_orderly(new_message(topic, f"x{i}".encode()), i % 4)
                        for i in range(80)]  # fmt: skip
            await until(lambda: len(seen) >= 20, 30, "c1 under way")
            async with c2:
                await until(lambda: len({s[1] for s in seen}) == 80, 60, "all 80 consumed")
                await asyncio.sleep(0.5)
        assert sorted(s[1] for s in seen) == sorted(r.msg_id for r in sent)  # each once
        assert {s[0] for s in seen} == {"c1", "c2"}
        for q in range(4):
            offsets = [s[3] for s in sorted(seen, key=lambda s: s[4]) if s[2] == q]
            assert offsets == list(range(20)), (q, offsets)  # in order, across the move

    asyncio.run(t())
