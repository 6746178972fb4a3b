"""Client side of consume retry and the ledger wiring, without sockets: the retry copy a
client sends itself, the retry topic restored, the group-commit ledger writer, and the
hooks writing real SQLite ledgers."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from broker_runtime.client.consume_service import ConsumeContext
from broker_runtime.client.idempotent import open_dedup_store
from broker_runtime.client.idempotent_listener import IdempotentListener
from broker_runtime.client.ledger_hooks import (
    ConsumerLedgerHooks,
    LedgerWriter,
    ProducerLedgerHooks,
)
from broker_runtime.client.model import (
    ConsumeStatus,
    ReceivedMessage,
    SendResult,
    SendStatus,
    new_message,
)
from broker_runtime.client.msg_id import set_uniq_id
from broker_runtime.client.rebalance import MessageQueue
from broker_runtime.client.retry import restore_retry_topic, retry_copy
from broker_runtime.common.message import (
    DELAY,
    MAX_RECONSUME_TIMES,
    ORIGIN_MESSAGE_ID,
    RECONSUME_TIME,
    RETRY_TOPIC,
    UNIQ_KEY,
    StoredMessage,
)
from broker_runtime.ledger.consumer import ConsumerLedger
from broker_runtime.ledger.producer import ProducerLedger

MQ = MessageQueue("Orders", "broker-a", 1)
RETRY_MQ = MessageQueue("%RETRY%g1", "broker-a", 0)


def received(
    offset: int, topic: str = "Orders", reconsume: int = 0, **props: str
) -> ReceivedMessage:
    msg = StoredMessage(
        0, 0, 0, 1, 0, offset, 5000 + offset, 0, 0, ("127.0.0.1", 1), 0, ("127.0.0.1", 2),
        reconsume, 0, b"body", topic, {UNIQ_KEY: f"U{offset}", **props},
    )  # fmt: skip
    return ReceivedMessage(msg, "broker-a")


def test_the_retry_copy_keeps_the_message_and_records_lineage() -> None:
    m = received(7, reconsume=2, KEYS="k1")
    copy = retry_copy(m, "g1", 16)
    assert copy.topic == "%RETRY%g1" and copy.body == b"body"
    p = copy.properties
    assert p[UNIQ_KEY] == "U7" and p["KEYS"] == "k1"
    assert p[RETRY_TOPIC] == "Orders" and p[ORIGIN_MESSAGE_ID] == m.offset_msg_id
    assert (p[RECONSUME_TIME], p[MAX_RECONSUME_TIMES], p[DELAY]) == ("3", "16", "5")
    assert retry_copy(m, "g1", 16, delay_level=1).properties[DELAY] == "1"
    # A message already retried keeps its first topic and first offset id.
    again = received(0, "%RETRY%g1", 1, RETRY_TOPIC="Orders", ORIGIN_MESSAGE_ID="FIRST")
    p2 = retry_copy(again, "g1", 16).properties
    assert p2[RETRY_TOPIC] == "Orders" and p2[ORIGIN_MESSAGE_ID] == "FIRST"


def test_messages_pulled_from_the_retry_topic_get_their_topic_back() -> None:
    mine = received(0, "%RETRY%g1", 1, RETRY_TOPIC="Orders")
    other = received(1, "%RETRY%g2", 1, RETRY_TOPIC="Payments")  # another group's: left alone
    plain = received(2)
    restore_retry_topic("g1", [mine, other, plain])
    assert [m.topic for m in (mine, other, plain)] == ["Orders", "%RETRY%g2", "Orders"]


def test_the_writer_merges_queued_calls_of_one_method_and_splits_results() -> None:
    calls: list[list[int]] = []
    gate = threading.Event()

    def ids(items: Sequence[int]) -> list[int]:
        gate.wait(5)
        calls.append(list(items))
        return [i * 10 for i in items]

    def other(items: Sequence[int]) -> None:
        calls.append([-1, *items])

    w = LedgerWriter()
    first = w.submit(ids, [1])  # taken at once; the rest queue up behind it
    time.sleep(0.05)
    f2, f3 = w.submit(ids, [2, 3]), w.submit(ids, [4])
    f4 = w.submit(other, [5])
    gate.set()
    assert first.result(5) == [10]
    assert f2.result(5) == [20, 30] and f3.result(5) == [40] and f4.result(5) is None
    w.close()
    assert calls == [[1], [2, 3, 4], [-1, 5]]
    assert w.transactions == 3
    with pytest.raises(RuntimeError, match="closed"):
        w.submit(ids, [9])


def test_a_failed_ledger_call_fails_every_caller_merged_into_it() -> None:
    def boom(items: Sequence[int]) -> None:
        raise OSError("disk gone")

    w = LedgerWriter()
    futures = [w.submit(boom, [i]) for i in range(3)]
    for f in futures:
        with pytest.raises(OSError, match="disk gone"):
            f.result(5)
    w.close()
    assert w.errors >= 1


def test_producer_stub_before_send_and_confirm_on_send_ok(tmp_path: Path) -> None:
    hooks = ProducerLedgerHooks(ProducerLedger.open(tmp_path))
    ok, lost = new_message("Orders", b"a"), new_message("Orders", b"b")
    for m in (ok, lost):
        set_uniq_id(m)

    async def run() -> None:
        await hooks.before_send(ok)  # type: ignore[misc]  # on the loop: an awaitable
        await hooks.before_send(lost)  # type: ignore[misc]
        r = SendResult(SendStatus.SEND_OK, ok.uniq_key or "", "OFF", MQ, 41)
        await hooks.send_result(ok, r, None)
        not_ok = SendResult(SendStatus.SLAVE_NOT_AVAILABLE, lost.uniq_key or "", "OFF", MQ, 42)
        await hooks.send_result(lost, not_ok, None)

    asyncio.run(run())
    stub = hooks.ledger.get(ok.uniq_key or "")
    assert stub is not None
    assert (stub["status"], stub["broker"], stub["queue_id"], stub["queue_offset"]) == (
        "CONFIRMED", "broker-a", 1, 41,
    )  # fmt: skip
    other = hooks.ledger.get(lost.uniq_key or "")
    assert other is not None and other["status"] == "UNCONFIRMED"  # not acknowledged
    assert hooks.ledger.bodies([ok.uniq_key or ""]) == {}  # bodies only when asked to
    hooks.close()


def test_producer_hooks_keep_bodies_when_asked(tmp_path: Path) -> None:
    hooks = ProducerLedgerHooks(ProducerLedger.open(tmp_path), keep_bodies=True)
    msg = new_message("Orders", b"kept for a repair")
    set_uniq_id(msg)
    hooks.before_send(msg)  # off the event loop: returns once written
    key = msg.uniq_key or ""
    stub = hooks.ledger.get(key)
    assert stub is not None and stub["status"] == "UNCONFIRMED"
    assert hooks.ledger.bodies([key]) == {key: b"kept for a repair"}
    hooks.close()


def test_consumer_log_rows_from_a_listener_thread_and_the_event_loop(tmp_path: Path) -> None:
    hooks = ConsumerLedgerHooks(ConsumerLedger.open(tmp_path), "g1", "client-1")

    def failing(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeStatus:
        raise RuntimeError("listener broke")

    wrapped = hooks.wrap(failing)
    a, b = received(3), received(0, "%RETRY%g1", 1, RETRY_TOPIC="Orders")
    # A plain listener runs on a thread: the hooks block there until their rows are written.
    hooks.received(MQ, [a])
    with pytest.raises(RuntimeError):
        wrapped([a], ConsumeContext(MQ))
    hooks.outcome(MQ, [a], ConsumeStatus.RECONSUME_LATER)

    async def on_loop() -> None:  # an async listener: the hooks hand back awaitables
        restore_retry_topic("g1", [b])
        await hooks.received(RETRY_MQ, [b])  # type: ignore[misc]
        await hooks.outcome(RETRY_MQ, [b], ConsumeStatus.CONSUME_SUCCESS)  # type: ignore[misc]

    asyncio.run(on_loop())
    rows = hooks.ledger.rows()
    assert [(r["msg_id"], r["topic"], r["queue_offset"], r["reconsume_times"], r["outcome"])
            for r in rows] == [
        ("U3", "Orders", 3, 0, "FAILED"),
        ("U0", "%RETRY%g1", 0, 1, "CONSUMED"),  # the topic pulled from, not the restored one
    ]  # fmt: skip
    assert all(r["group"] == "g1" and r["client_id"] == "client-1" for r in rows)
    assert all(r["finished_at"] >= r["received_at"] for r in rows)
    assert hooks.errors == 0
    hooks.close()


def test_an_idempotent_listener_runs_each_effect_once_per_group(tmp_path: Path) -> None:
    effects: list[str] = []
    attempts: dict[str, int] = {}

    def handle(m: ReceivedMessage) -> ConsumeStatus:
        attempts[m.msg_id] = attempts.get(m.msg_id, 0) + 1
        if m.msg_id == "U2" and attempts[m.msg_id] == 1:
            return ConsumeStatus.RECONSUME_LATER  # fails once: not marked, runs again
        effects.append(m.msg_id)
        return ConsumeStatus.CONSUME_SUCCESS

    store = open_dedup_store(tmp_path)
    listener = IdempotentListener(handle, store, "g1")
    ctx = ConsumeContext(MQ)
    first, dup, flaky = received(1), received(1), received(2)
    assert listener([first], ctx) is ConsumeStatus.CONSUME_SUCCESS
    assert listener([dup], ctx) is ConsumeStatus.CONSUME_SUCCESS  # a duplicate: acked, not run
    assert listener([flaky], ctx) is ConsumeStatus.RECONSUME_LATER
    assert listener([flaky], ctx) is ConsumeStatus.CONSUME_SUCCESS
    assert effects == ["U1", "U2"]
    assert (listener.stats.ran, listener.stats.skipped) == (3, 1)
    other_group = IdempotentListener(handle, store, "g2")  # de-dup is per group
    assert other_group([received(1)], ctx) is ConsumeStatus.CONSUME_SUCCESS
    assert effects == ["U1", "U2", "U1"]
