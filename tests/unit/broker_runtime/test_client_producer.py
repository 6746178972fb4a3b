"""Producer send paths against scripted name server and brokers on loopback.

The scripted brokers store what they receive and misbehave on cue (answer late, refuse,
answer an error), so that retries, failed-broker avoidance and the duplicate a retry after
a lost answer makes are checked against what each broker actually received.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from broker_runtime.client.model import MQBrokerError, MQClientError, SendStatus, new_message
from broker_runtime.client.producer import Producer
from broker_runtime.common.message import UNIQ_KEY, string_to_properties
from broker_runtime.remoting.bodies import (
    BrokerData,
    QueueData,
    TopicRouteData,
    decode_batch,
    encode_json,
)
from broker_runtime.remoting.command import RemotingCommand, response_to
from broker_runtime.remoting.connection import Connection
from broker_runtime.remoting.headers import SendMessageRequestHeader, SendMessageResponseHeader
from broker_runtime.remoting.protocol import RequestCode, ResponseCode
from broker_runtime.remoting.server import ProcessorTable, RemotingServer

R = ResponseCode


@dataclass
class ScriptedBroker:
    name: str
    stored: list[dict[str, str]] = field(default_factory=list)
    offsets: dict[int, int] = field(default_factory=dict)
    delay_s: float = 0.0  # answer this late (after storing)
    answer: int = R.SUCCESS
    server: RemotingServer | None = None

    async def send(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        h = SendMessageRequestHeader.of(cmd)
        if self.answer not in (R.SUCCESS, R.SLAVE_NOT_AVAILABLE):
            return response_to(cmd, self.answer, "scripted failure")
        items = (
            decode_batch(cmd.body)
            if cmd.code == RequestCode.SEND_BATCH_MESSAGE
            else [(cmd.body, string_to_properties(h.properties), h.flag)]
        )
        first = self.offsets.get(h.queue_id, 0)
        for _, props, _ in items:
            self.stored.append({**props, "queue": str(h.queue_id)})
        self.offsets[h.queue_id] = first + len(items)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        out = SendMessageResponseHeader("OFFSETID", h.queue_id, first, batch_count=len(items))
        return response_to(cmd, self.answer, fields=out.fields())

    async def ok(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        return response_to(cmd, R.SUCCESS)

    @property
    def addr(self) -> str:
        assert self.server is not None
        return f"127.0.0.1:{self.server.port}"


async def with_cluster(
    n_brokers: int,
    test: Callable[[list[ScriptedBroker], str], Awaitable[None]],
    queues: int = 2,
) -> None:
    brokers = [ScriptedBroker(f"broker-{chr(97 + i)}") for i in range(n_brokers)]
    for b in brokers:
        table = ProcessorTable(
            {
                RequestCode.SEND_MESSAGE: b.send,
                RequestCode.SEND_BATCH_MESSAGE: b.send,
                RequestCode.HEART_BEAT: b.ok,
                RequestCode.UNREGISTER_CLIENT: b.ok,
            }
        )
        b.server = RemotingServer(table)
        await b.server.start()

    async def route(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        if cmd.ext_fields.get("topic") != "T":
            return response_to(cmd, R.TOPIC_NOT_EXIST, "no such topic")
        data = TopicRouteData(
            [QueueData(b.name, queues, queues) for b in brokers],
            [BrokerData("c", b.name, {0: b.addr}) for b in brokers],
        )
        return response_to(cmd, R.SUCCESS, body=data.encode())

    async def cluster(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        table = {b.name: {"brokerName": b.name, "brokerAddrs": {"0": b.addr}} for b in brokers}
        return response_to(cmd, R.SUCCESS, body=encode_json({"brokerAddrTable": table}))

    ns = RemotingServer(
        ProcessorTable(
            {
                RequestCode.GET_ROUTEINFO_BY_TOPIC: route,
                RequestCode.GET_BROKER_CLUSTER_INFO: cluster,
            }
        )
    )
    await ns.start()
    try:
        await test(brokers, f"127.0.0.1:{ns.port}")
    finally:
        await ns.close()
        for b in brokers:
            assert b.server is not None
            await b.server.close()


def run(n: int, test: Callable[[list[ScriptedBroker], str], Awaitable[None]]) -> None:
    asyncio.run(with_cluster(n, test))


def test_send_round_robins_and_returns_queue_offset_and_uniq_key() -> None:
    async def t(brokers: list[ScriptedBroker], ns: str) -> None:
        async with Producer(ns, "PG") as p:
            results = [
                await p.send(new_message("T", b"x", tags="A", keys=["k1", "k2"])) for _ in range(8)
            ]
        assert [r.status for r in results] == [SendStatus.SEND_OK] * 8
        assert {(r.mq.broker, r.mq.queue_id) for r in results} == {
            (b.name, q) for b in brokers for q in range(2)
        }
        assert [r.queue_offset for r in results[:4]] == [0, 0, 0, 0]
        assert [r.queue_offset for r in results[4:]] == [1, 1, 1, 1]
        stored = [m for b in brokers for m in b.stored]
        assert sorted(m[UNIQ_KEY] for m in stored) == sorted(r.msg_id for r in results)
        assert all(m["TAGS"] == "A" and m["KEYS"] == "k1 k2" for m in stored)

    run(2, t)


def test_a_lost_answer_makes_the_retry_store_the_message_twice() -> None:
    """Seed 002 6.1.2.1: stored on broker-a, answer too late, retried on broker-b."""

    async def t(brokers: list[ScriptedBroker], ns: str) -> None:
        a, b = brokers
        a.delay_s = 1.0
        async with Producer(ns, "PG", send_timeout_s=0.6) as p:  # round robin starts at a
            result = await p.send(new_message("T", b"pay"))
        assert result.mq.broker == "broker-b"
        assert [m[UNIQ_KEY] for m in a.stored] == [result.msg_id]
        assert [m[UNIQ_KEY] for m in b.stored] == [result.msg_id]

    run(2, t)


def test_failed_broker_is_isolated_for_following_sends() -> None:
    async def t(brokers: list[ScriptedBroker], ns: str) -> None:
        a, _ = brokers
        a.answer = R.SYSTEM_BUSY
        async with Producer(ns, "PG") as p:
            results = [await p.send(new_message("T", b"x")) for _ in range(6)]
            assert p.faults.isolated(p.clock.now_ms()) == ["broker-a"]
        assert {r.mq.broker for r in results} == {"broker-b"}
        assert a.stored == []  # tried at most once, then kept away

    run(2, t)


def test_dead_broker_is_skipped() -> None:
    async def t(brokers: list[ScriptedBroker], ns: str) -> None:
        a = brokers[0]
        async with Producer(ns, "PG") as p:
            await p.send(new_message("T", b"warm"))  # routes known, connections open
            assert a.server is not None
            await a.server.close()
            a.server._server.close()  # type: ignore[union-attr]
            results = [await p.send(new_message("T", b"x")) for _ in range(4)]
        assert {r.mq.broker for r in results} == {"broker-b"}

    run(2, t)


def test_non_retryable_error_is_raised_at_once() -> None:
    async def t(brokers: list[ScriptedBroker], ns: str) -> None:
        (a,) = brokers
        a.answer = R.MESSAGE_ILLEGAL
        results: list[object] = []
        async with Producer(ns, "PG") as p:
            p.on_send_result.append(lambda m, r, e: results.append(e))
            with pytest.raises(MQBrokerError) as err:
                await p.send(new_message("T", b"x"))
        assert err.value.code == R.MESSAGE_ILLEGAL
        assert len(results) == 1 and results[0] is err.value

    run(1, t)


def test_all_retries_failing_gives_one_clear_error() -> None:
    async def t(brokers: list[ScriptedBroker], ns: str) -> None:
        for b in brokers:
            b.answer = R.SYSTEM_ERROR
        async with Producer(ns, "PG") as p:
            with pytest.raises(MQClientError, match="failed after 3 attempt"):
                await p.send(new_message("T", b"x"))

    run(2, t)


def test_slave_not_available_is_a_result_not_an_error() -> None:
    async def t(brokers: list[ScriptedBroker], ns: str) -> None:
        brokers[0].answer = R.SLAVE_NOT_AVAILABLE
        async with Producer(ns, "PG") as p:
            r = await p.send(new_message("T", b"x"))
        assert r.status is SendStatus.SLAVE_NOT_AVAILABLE
        assert len(brokers[0].stored) == 1

    run(1, t)


def test_hooks_see_each_message_before_and_after() -> None:
    async def t(brokers: list[ScriptedBroker], ns: str) -> None:
        log: list[tuple[str, str, int | None]] = []
        async with Producer(ns, "PG") as p:
            p.on_before_send.append(lambda m: log.append(("before", m.properties[UNIQ_KEY], None)))

            async def after(m: object, r: object, e: object) -> None:
                assert r is not None and e is None
                log.append(("after", r.msg_id, r.queue_offset))  # type: ignore[attr-defined]

            p.on_send_result.append(after)
            batch = [new_message("T", f"{i}".encode()) for i in range(3)]
            result = await p.send_batch(batch)
        ids = [m.properties[UNIQ_KEY] for m in batch]
        assert result.msg_ids == tuple(ids)
        assert log == [("before", i, None) for i in ids] + [
            ("after", i, result.queue_offset + n) for n, i in enumerate(ids)
        ]
        stored = [m for b in brokers for m in b.stored]
        assert [m[UNIQ_KEY] for m in stored] == ids  # one request, in order

    run(1, t)


def test_async_oneway_and_ordered_sends() -> None:
    async def t(brokers: list[ScriptedBroker], ns: str) -> None:
        got: list[object] = []
        async with Producer(ns, "PG") as p:
            task = p.send_async(new_message("T", b"a"), lambda r, e: got.append(r))
            r = await task
            assert got == [r]
            await p.send_oneway(new_message("T", b"o"))
            ordered = [
                await p.send_orderly(new_message("T", f"{i}".encode()), "order-42")
                for i in range(5)
            ]
        assert len({(r.mq.broker, r.mq.queue_id) for r in ordered}) == 1
        assert [r.queue_offset for r in ordered] == sorted(r.queue_offset for r in ordered)
        await asyncio.sleep(0)
        assert sum(len(b.stored) for b in brokers) == 7

    run(2, t)


def test_unknown_topic_uses_every_master_for_auto_creation() -> None:
    async def t(brokers: list[ScriptedBroker], ns: str) -> None:
        async with Producer(ns, "PG", default_topic_queue_nums=3) as p:
            results = [await p.send(new_message("NEW", b"x")) for _ in range(6)]
        assert {(r.mq.broker, r.mq.queue_id) for r in results} == {
            (b.name, q) for b in brokers for q in range(3)
        }

    run(2, t)


def test_bad_messages_are_refused_before_sending() -> None:
    async def t(brokers: list[ScriptedBroker], ns: str) -> None:
        async with Producer(ns, "PG", max_message_size=10) as p:
            with pytest.raises(MQClientError, match="empty"):
                await p.send(new_message("T", b""))
            with pytest.raises(MQClientError, match="11 bytes"):
                await p.send(new_message("T", b"x" * 11))
            with pytest.raises(ValueError, match="topic"):
                await p.send(new_message("bad topic", b"x"))
        assert brokers[0].stored == []
        with pytest.raises(MQClientError, match="not started"):
            await p.send(new_message("T", b"x"))

    run(1, t)
