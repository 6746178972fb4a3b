"""Process queue, offset stores and the concurrent consume service (no sockets)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from broker_runtime.client.consume_service import ConsumeContext, ConsumeService
from broker_runtime.client.model import ConsumeStatus, MessageModel, ReceivedMessage
from broker_runtime.client.offset_store import (
    NO_OFFSET,
    LocalFileOffsetStore,
    OffsetStore,
    ReadType,
    RemoteBrokerOffsetStore,
)
from broker_runtime.client.process_queue import ProcessQueue
from broker_runtime.client.rebalance import MessageQueue
from broker_runtime.common.message import StoredMessage

MQ = MessageQueue("T", "broker-a", 2)


def stored(offset: int, body: bytes = b"x") -> ReceivedMessage:
    msg = StoredMessage(
        0, 0, 0, MQ.queue_id, 0, offset, 1000 + offset, 0, 0, ("127.0.0.1", 1), 0,
        ("127.0.0.1", 2), 0, 0, body, MQ.topic, {"UNIQ_KEY": f"ID{offset}"},
    )  # fmt: skip
    return ReceivedMessage(msg, MQ.broker)


# -- process queue --------------------------------------------------------------------------
def test_commit_offset_is_the_lowest_unprocessed_seed_002_2_3() -> None:
    pq = ProcessQueue()
    assert pq.remove([5]) == -1  # nothing in flight
    assert pq.put([stored(o) for o in range(2101, 2201)]) == 100
    # 2102..2200 done, 2101 still running: the offset stays at 2101.
    assert pq.remove(range(2102, 2201)) == 2101
    assert len(pq) == 1 and pq.first_offset() == 2101
    assert pq.remove([2101]) == 2201  # consumerOffset = 2201
    assert len(pq) == 0 and pq.msg_size == 0


def test_out_of_order_completion_moves_the_offset_to_each_new_lowest() -> None:
    pq = ProcessQueue()
    pq.put([stored(o) for o in range(10)])
    assert pq.remove([3, 1, 0]) == 2
    assert pq.remove([2]) == 4
    assert pq.max_span() == 9 - 4
    assert pq.remove([5, 6, 7, 8, 9]) == 4
    assert [m.queue_offset for m in pq.messages()] == [4]


def test_a_re_pulled_offset_is_not_counted_twice() -> None:
    pq = ProcessQueue()
    assert pq.put([stored(1, b"abc"), stored(2, b"de")]) == 2
    assert pq.put([stored(2, b"de"), stored(3, b"f")]) == 1
    assert len(pq) == 3 and pq.msg_size == 6 and pq.max_offset == 3
    assert 2 in pq and 4 not in pq


# -- offset stores --------------------------------------------------------------------------
def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


def test_remote_store_reads_memory_first_and_persists_only_changes() -> None:
    broker = {MQ: 7}
    commits: list[tuple[MessageQueue, int]] = []

    async def fetch(mq: MessageQueue) -> int:
        return broker.get(mq, NO_OFFSET)

    async def commit(mq: MessageQueue, off: int) -> None:
        commits.append((mq, off))
        broker[mq] = off

    async def t() -> None:
        store = RemoteBrokerOffsetStore(fetch, commit)
        assert await store.read(MQ, ReadType.MEMORY) == NO_OFFSET
        assert await store.read(MQ, ReadType.MEMORY_FIRST_THEN_STORE) == 7
        await store.persist_all([MQ])
        assert commits == []  # just read from the broker: nothing to write back
        store.update(MQ, 9, increase_only=True)
        store.update(MQ, 8, increase_only=True)  # a late, lower result is ignored
        assert await store.read(MQ, ReadType.MEMORY) == 9
        await store.persist_all([MQ])
        await store.persist_all([MQ])
        assert commits == [(MQ, 9)]
        other = MessageQueue("T", "broker-b", 0)
        assert await store.read(other, ReadType.STORE) == NO_OFFSET

    run(t())


def test_remote_store_keeps_a_failed_commit_for_the_next_round() -> None:
    fail = [True]
    commits: list[int] = []

    async def fetch(mq: MessageQueue) -> int:
        return NO_OFFSET

    async def commit(mq: MessageQueue, off: int) -> None:
        if fail[0]:
            raise ConnectionError("broker down")
        commits.append(off)

    async def t() -> None:
        store = RemoteBrokerOffsetStore(fetch, commit)
        store.update(MQ, 3)
        await store.persist_all([MQ])
        assert commits == [] and MQ in store.table.dirty
        fail[0] = False
        await store.persist_all([MQ])
        assert commits == [3] and not store.table.dirty

    run(t())


def test_local_store_round_trips_through_its_file(tmp_path: Path) -> None:
    async def t() -> None:
        store = LocalFileOffsetStore(tmp_path, "10.0.0.1@DEFAULT", "G")
        assert await store.read(MQ, ReadType.STORE) == NO_OFFSET
        store.update(MQ, 42)
        await store.persist_all([MQ])
        assert store.path == tmp_path / "10.0.0.1@DEFAULT" / "G" / "offsets.json"
        rows = json.loads(store.path.read_text())["offsetTable"]
        assert rows == [{"brokerName": "broker-a", "offset": 42, "queueId": 2, "topic": "T"}]
        store.update(MQ, 43)
        await store.persist_all([MQ])
        assert store.path.with_name("offsets.json.bak").exists()
        again = LocalFileOffsetStore(tmp_path, "10.0.0.1@DEFAULT", "G")
        assert await again.read(MQ, ReadType.MEMORY) == NO_OFFSET
        await again.load()
        assert await again.read(MQ, ReadType.MEMORY) == 43
        again.remove(MQ)  # broadcasting keeps offsets of queues it no longer reads
        assert await again.read(MQ, ReadType.MEMORY) == 43

    run(t())


# -- consume service ------------------------------------------------------------------------
class MemoryOffsets(RemoteBrokerOffsetStore):
    def __init__(self) -> None:
        async def fetch(mq: MessageQueue) -> int:
            return NO_OFFSET

        async def commit(mq: MessageQueue, off: int) -> None:
            return None

        super().__init__(fetch, commit)


async def settle(service: ConsumeService) -> None:
    for _ in range(200):
        await asyncio.sleep(0.005)
        if not service._tasks:
            return
    raise AssertionError("consume tasks did not finish")


def test_slow_message_holds_the_offset_until_it_is_done() -> None:
    async def t() -> None:
        release = asyncio.Event()

        async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeStatus:
            if msgs[0].queue_offset == 0:
                await release.wait()
            return ConsumeStatus.CONSUME_SUCCESS

        offsets = MemoryOffsets()
        svc = ConsumeService(listener, MessageModel.CLUSTERING, offsets, _no_send_back, 4)
        pq = ProcessQueue()
        msgs = [stored(o) for o in range(10)]
        pq.put(msgs)
        svc.submit(MQ, pq, msgs)
        for _ in range(100):
            await asyncio.sleep(0.005)
            if len(pq) == 1:
                break
        assert offsets.table.get(MQ) == 0 and svc.consumed == 9
        release.set()
        await settle(svc)
        assert offsets.table.get(MQ) == 10 and svc.consumed == 10
        await svc.shutdown()

    run(t())


async def _no_send_back(msg: ReceivedMessage, delay: int) -> bool:
    return False


def test_failed_message_is_retried_locally_when_send_back_fails() -> None:
    async def t() -> None:
        calls: list[tuple[int, int]] = []
        outcomes: list[ConsumeStatus] = []

        def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeStatus | None:
            m = msgs[0]
            calls.append((m.queue_offset, m.reconsume_times))
            if m.queue_offset == 1 and m.reconsume_times == 0:
                return None  # counts as RECONSUME_LATER
            if m.queue_offset == 2 and m.reconsume_times == 0:
                raise RuntimeError("boom")
            return ConsumeStatus.CONSUME_SUCCESS

        offsets = MemoryOffsets()
        svc = ConsumeService(
            listener, MessageModel.CLUSTERING, offsets, _no_send_back, 2, retry_delay_s=0.05
        )
        svc.on_outcome.append(lambda mq, msgs, status: outcomes.append(status))
        pq = ProcessQueue()
        msgs = [stored(o) for o in range(4)]
        pq.put(msgs)
        svc.submit(MQ, pq, msgs)
        await asyncio.sleep(0.02)
        assert offsets.table.get(MQ) == 1  # 1 and 2 failed and wait for their retry
        await settle(svc)
        assert sorted(calls) == [(0, 0), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0)]
        assert offsets.table.get(MQ) == 4 and len(pq) == 0
        assert outcomes.count(ConsumeStatus.RECONSUME_LATER) == 2
        await svc.shutdown()

    run(t())


def test_sent_back_message_leaves_the_queue_and_broadcast_failures_are_dropped() -> None:
    async def t(model: MessageModel) -> tuple[list[int], int | None]:
        sent: list[int] = []

        async def send_back(msg: ReceivedMessage, delay: int) -> bool:
            sent.append(msg.queue_offset)
            return True

        async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeStatus:
            return ConsumeStatus.RECONSUME_LATER

        offsets = MemoryOffsets()
        svc = ConsumeService(listener, model, offsets, send_back)
        pq = ProcessQueue()
        msgs = [stored(o) for o in range(3)]
        pq.put(msgs)
        svc.submit(MQ, pq, msgs)
        await settle(svc)
        await svc.shutdown()
        return sent, offsets.table.get(MQ)

    assert asyncio.run(t(MessageModel.CLUSTERING)) == ([0, 1, 2], 3)
    assert asyncio.run(t(MessageModel.BROADCASTING)) == ([], 3)


def test_results_of_a_dropped_queue_are_not_committed() -> None:
    async def t() -> None:
        gate = asyncio.Event()

        async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeStatus:
            await gate.wait()
            return ConsumeStatus.CONSUME_SUCCESS

        offsets: OffsetStore = MemoryOffsets()
        svc = ConsumeService(listener, MessageModel.CLUSTERING, offsets, _no_send_back)
        pq = ProcessQueue()
        msgs = [stored(0)]
        pq.put(msgs)
        svc.submit(MQ, pq, msgs)
        await asyncio.sleep(0.01)
        pq.dropped = True  # rebalanced away while the message was being consumed
        gate.set()
        await settle(svc)
        assert offsets.table.get(MQ) is None
        await svc.shutdown()

    run(t())


@pytest.mark.parametrize("batch_max", [1, 3])
def test_batches_and_ack_index(batch_max: int) -> None:
    async def t() -> None:
        seen: list[list[int]] = []

        async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeStatus:
            seen.append([m.queue_offset for m in msgs])
            return ConsumeStatus.CONSUME_SUCCESS

        offsets = MemoryOffsets()
        svc = ConsumeService(
            listener, MessageModel.CLUSTERING, offsets, _no_send_back, 1, batch_max
        )
        pq = ProcessQueue()
        msgs = [stored(o) for o in range(7)]
        pq.put(msgs)
        svc.submit(MQ, pq, msgs)
        await settle(svc)
        assert sorted(o for b in seen for o in b) == list(range(7))
        assert max(len(b) for b in seen) == batch_max
        assert offsets.table.get(MQ) == 7
        await svc.shutdown()

    run(t())


def test_ack_index_marks_the_rest_of_a_batch_failed() -> None:
    async def t() -> None:
        sent: list[int] = []

        async def send_back(msg: ReceivedMessage, delay: int) -> bool:
            sent.append(msg.queue_offset)
            return True

        async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeStatus:
            ctx.ack_index = 0  # only the first of the batch went through
            return ConsumeStatus.CONSUME_SUCCESS

        offsets = MemoryOffsets()
        svc = ConsumeService(listener, MessageModel.CLUSTERING, offsets, send_back, 1, 3)
        pq = ProcessQueue()
        msgs = [stored(o) for o in range(3)]
        pq.put(msgs)
        svc.submit(MQ, pq, msgs)
        await settle(svc)
        assert sent == [1, 2] and svc.consumed == 1 and offsets.table.get(MQ) == 3
        await svc.shutdown()

    run(t())


def test_filtered_tail_is_committed_once_nothing_is_in_flight() -> None:
    pq = ProcessQueue()
    pq.put([stored(0), stored(1)])
    pq.pulled_to(4)  # offsets 2 and 3 were skipped by the tag filter
    assert pq.remove([1]) == 0
    assert pq.remove([0]) == 4
