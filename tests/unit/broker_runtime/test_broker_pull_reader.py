"""What a pull reads (getMessage statuses, offset correction, tag filtering), the time search,
and the long-polling wake-up, over a real store in a temp dir."""

from __future__ import annotations

import asyncio

import pytest

from broker_runtime.broker.long_polling import PullHoldService
from broker_runtime.broker.message_filter import parse_subscription
from broker_runtime.broker.pull_reader import GetStatus, read_queue
from broker_runtime.common.clock import FakeClock
from broker_runtime.common.config import StoreConfig
from broker_runtime.common.message import TAGS, Message
from broker_runtime.store import record_codec as codec
from broker_runtime.store.message_store import MessageStore


@pytest.fixture
def store(small_config: StoreConfig) -> MessageStore:
    clock = FakeClock()
    s = MessageStore(small_config, clock=clock)
    for i, tag in enumerate(["A", "B", "A", "C", "B"]):
        clock.advance(1000)
        s.put_message(Message("T", f"m{i}".encode(), {TAGS: tag}, queue_id=1))
    s.wait_dispatched()
    yield s
    s.shutdown()


def read(store: MessageStore, offset: int, sub: str = "*", master: bool = True, n: int = 32):  # type: ignore[no-untyped-def]
    return read_queue(
        store, "T", 1, offset, n, parse_subscription(sub),
        max_bytes=1 << 20, correct_offset=master, slave_lag_bytes=1 << 30,
    )  # fmt: skip


def test_statuses_and_next_offsets(store: MessageStore) -> None:
    r = read(store, 0, n=2)
    assert r.status is GetStatus.FOUND and r.next_begin_offset == 2
    assert [codec.decode(u).body for u in r.units] == [b"m0", b"m1"]
    assert (r.min_offset, r.max_offset) == (0, 5)
    assert read(store, 5).status is GetStatus.OFFSET_OVERFLOW_ONE
    over = read(store, 9)
    assert over.status is GetStatus.OFFSET_OVERFLOW_BADLY and over.next_begin_offset == 0
    assert read(store, 9, master=False).next_begin_offset == 9  # a slave does not correct
    empty = read_queue(
        store, "T", 3, 2, 32, parse_subscription("*"),
        max_bytes=1 << 20, correct_offset=True, slave_lag_bytes=1,
    )  # fmt: skip
    assert empty.status is GetStatus.NO_MESSAGE_IN_QUEUE and empty.next_begin_offset == 0


def test_tag_filter_and_byte_limit(store: MessageStore) -> None:
    r = read(store, 0, "A || C")
    assert [codec.decode(u).body for u in r.units] == [b"m0", b"m2", b"m3"]
    assert r.next_begin_offset == 5
    none = read(store, 0, "Z")
    assert none.status is GetStatus.NO_MATCHED_MSG and none.next_begin_offset == 5
    one = read_queue(
        store, "T", 1, 0, 32, parse_subscription("*"),
        max_bytes=1, correct_offset=True, slave_lag_bytes=1 << 30,
    )  # fmt: skip
    assert len(one.units) == 1 and one.next_begin_offset == 1  # at least one, then stop
    assert parse_subscription("*").matches_all and parse_subscription(" A ||B ").tags == {"A", "B"}


def test_times(store: MessageStore) -> None:
    t0 = store.store_time_at("T", 1, 0)
    assert store.store_time_at("T", 1, 4) == t0 + 4000
    assert store.store_time_at("T", 1, 5) == 0
    assert store.offset_by_time("T", 1, 0) == 0
    assert store.offset_by_time("T", 1, t0 + 2500) == 3
    assert store.offset_by_time("T", 1, t0 + 10**6) == 5


def test_hold_wakes_on_dispatch_and_times_out(store: MessageStore) -> None:
    async def t() -> None:
        hold = PullHoldService(asyncio.get_running_loop())
        store.dispatcher.listeners.append(hold.on_dispatched)
        arrived = lambda: store.max_offset("T", 1) > 5  # noqa: E731
        assert not await hold.hold(("T", 1), 0.2, arrived)
        waiter = asyncio.ensure_future(hold.hold(("T", 1), 10, arrived))
        await asyncio.sleep(0.05)
        assert hold.waiting == 1
        store.put_message(Message("T", b"new", queue_id=1))
        assert await asyncio.wait_for(waiter, 5)
        assert hold.waiting == 0

    asyncio.run(t())
