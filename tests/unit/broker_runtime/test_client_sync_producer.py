"""SyncProducer's blocking send path against the scripted brokers of test_client_producer.

The scripted cluster runs on the test's event loop; the blocking calls run in other threads
(as a script's or an Airflow task's would), so the loop keeps serving them.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from broker_runtime.client.model import MQBrokerError, MQClientError, SendStatus, new_message
from broker_runtime.client.producer import Producer
from broker_runtime.client.sync import SyncProducer
from broker_runtime.common.message import UNIQ_KEY
from tests.unit.broker_runtime.test_client_producer import R, ScriptedBroker, with_cluster

Test = Callable[[list[ScriptedBroker], str, asyncio.AbstractEventLoop], None]


def run(n: int, test: Test) -> None:
    async def in_thread(brokers: list[ScriptedBroker], ns: str) -> None:
        await asyncio.to_thread(test, brokers, ns, asyncio.get_running_loop())

    asyncio.run(with_cluster(n, in_thread))


def connections(p: SyncProducer) -> dict[str, int]:
    """Idle blocking channels by broker address: the sends did not go through the loop."""
    return {addr: len(idle) for addr, idle in p._pool._idle.items() if idle}


def test_sends_go_round_robin_over_blocking_sockets() -> None:
    def t(brokers: list[ScriptedBroker], ns: str, _: object) -> None:
        with SyncProducer(Producer(ns, "PG")) as p:
            results = [p.send(new_message("T", b"x", tags="A", keys=["k"])) for _ in range(8)]
            assert connections(p) == {b.addr: 1 for b in brokers}
        assert [r.status for r in results] == [SendStatus.SEND_OK] * 8
        assert {(r.mq.broker, r.mq.queue_id) for r in results} == {
            (b.name, q) for b in brokers for q in range(2)
        }
        assert sorted(r.queue_offset for r in results) == [0] * 4 + [1] * 4
        stored = [m for b in brokers for m in b.stored]
        assert sorted(m[UNIQ_KEY] for m in stored) == sorted(r.msg_id for r in results)
        assert all(m["TAGS"] == "A" and m["KEYS"] == "k" for m in stored)

    run(2, t)


def test_a_lost_answer_times_out_and_the_retry_stores_the_message_twice() -> None:
    def t(brokers: list[ScriptedBroker], ns: str, _: object) -> None:
        a, b = brokers
        a.delay_s = 1.0
        with SyncProducer(Producer(ns, "PG", send_timeout_s=0.5)) as p:
            result = p.send(new_message("T", b"pay"))  # round robin starts at a
            assert a.addr not in connections(p)  # the timed-out channel was closed
            assert p.producer.faults.isolated(p.producer.clock.now_ms()) == ["broker-a"]
        assert result.mq.broker == "broker-b"
        assert [m[UNIQ_KEY] for m in a.stored] == [result.msg_id]
        assert [m[UNIQ_KEY] for m in b.stored] == [result.msg_id]

    run(2, t)


def test_a_dead_broker_is_skipped() -> None:
    def t(brokers: list[ScriptedBroker], ns: str, loop: asyncio.AbstractEventLoop) -> None:
        a = brokers[0]
        with SyncProducer(Producer(ns, "PG")) as p:
            p.send(new_message("T", b"warm"))
            p.send(new_message("T", b"warm"))  # a channel to each broker
            assert a.server is not None
            asyncio.run_coroutine_threadsafe(a.server.close(), loop).result()
            results = [p.send(new_message("T", b"x")) for _ in range(4)]
        assert {r.mq.broker for r in results} == {"broker-b"}

    run(2, t)


def test_broker_errors_retry_or_raise_as_on_the_loop() -> None:
    def t(brokers: list[ScriptedBroker], ns: str, _: object) -> None:
        a, b = brokers
        with SyncProducer(Producer(ns, "PG")) as p:
            a.answer = R.SYSTEM_BUSY  # retried elsewhere, then kept away
            assert {p.send(new_message("T", b"x")).mq.broker for _ in range(4)} == {"broker-b"}
            b.answer = R.MESSAGE_ILLEGAL  # no retry improves on it
            with pytest.raises(MQBrokerError) as err:
                p.send(new_message("T", b"x"))
            assert err.value.code == R.MESSAGE_ILLEGAL
            a.answer = b.answer = R.SYSTEM_ERROR
            with pytest.raises(MQClientError, match="failed after 3 attempt"):
                p.send(new_message("T", b"x"))
        assert a.stored == []

    run(2, t)


def test_a_batch_is_one_request_and_a_bad_one_is_refused() -> None:
    def t(brokers: list[ScriptedBroker], ns: str, _: object) -> None:
        batch = [new_message("T", f"{i}".encode()) for i in range(3)]
        with SyncProducer(Producer(ns, "PG", max_message_size=10)) as p:
            result = p.send_batch(batch)
            with pytest.raises(MQClientError, match="same topic"):
                p.send_batch([new_message("T", b"a"), new_message("U", b"b")])
            with pytest.raises(MQClientError, match="exceed 10 bytes"):
                p.send_batch([new_message("T", b"x" * 6), new_message("T", b"y" * 6)])
            with pytest.raises(MQClientError, match="empty batch"):
                p.send_batch([])
        ids = [m.properties[UNIQ_KEY] for m in batch]
        assert result.msg_ids == tuple(ids)
        assert [m[UNIQ_KEY] for m in brokers[0].stored] == ids  # in one request, in order
        with pytest.raises(MQClientError, match="not started"):
            p.send(new_message("T", b"x"))

    run(1, t)


def test_hooks_still_run_on_the_producers_loop() -> None:
    def t(brokers: list[ScriptedBroker], ns: str, _: object) -> None:
        seen: list[tuple[str, str]] = []
        producer = Producer(ns, "PG")
        producer.on_before_send.append(
            lambda m: seen.append((threading.current_thread().name, m.properties[UNIQ_KEY]))
        )
        with SyncProducer(producer) as p:
            result = p.send(new_message("T", b"x"))
            assert connections(p) == {}  # went through the loop's connection
        assert seen == [("mq-producer", result.msg_id)]

    run(1, t)


def test_threads_share_the_pool() -> None:
    def t(brokers: list[ScriptedBroker], ns: str, _: object) -> None:
        with SyncProducer(Producer(ns, "PG")) as p, ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda i: p.send(new_message("T", b"%d" % i)), range(200)))
            assert all(0 < n <= 4 for n in connections(p).values())
        stored = sorted(m[UNIQ_KEY] for b in brokers for m in b.stored)
        assert stored == sorted(r.msg_id for r in results) and len(set(stored)) == 200

    run(2, t)
