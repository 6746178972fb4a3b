"""Queue locks on a live master: LOCK/UNLOCK_BATCH_MQ for orderly consumers, and the queue
access lock (seed 001) holding a new owner's pulls back until the old owner acked or timed
out; with it off, two owners both get the same messages.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from broker_runtime.common.message import UNIQ_KEY
from broker_runtime.remoting.bodies import (
    ConsumerData,
    HeartbeatData,
    LockBatchRequestBody,
    SubscriptionData,
    decode_json,
    decode_lock_ok,
)
from broker_runtime.remoting.command import RemotingCommand
from broker_runtime.remoting.headers import QueueOffsetHeader, TopicHeader, TopicQueueHeader
from broker_runtime.remoting.protocol import RequestCode as C
from broker_runtime.remoting.protocol import ResponseCode as R
from tests.integration.cluster_fixtures import Cluster, RawClient, running_cluster

pytestmark = pytest.mark.integration
MASTER = "broker-a-master"
HOLD_MS = 2000


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    settings = {"queue_access_lock": "true", "queue_lock_hold_timeout_ms": str(HOLD_MS)}
    with running_cluster(
        tmp_path_factory.mktemp("lock") / "c", name_servers=1, slaves=False, settings=settings
    ) as c:
        yield c


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


@asynccontextmanager
async def consumers(addr: str, group: str, topic: str, *ids: str) -> AsyncIterator[list[RawClient]]:
    """One connection per client id, each a heartbeating member of `group`."""
    clients = [RawClient() for _ in ids]
    try:
        for c, cid in zip(clients, ids, strict=True):
            data = ConsumerData(group, subscriptions=[SubscriptionData(topic)])
            hb = HeartbeatData(cid, consumers=[data])
            assert (await c.call(addr, C.HEART_BEAT, body=hb.encode())).code == R.SUCCESS
        yield clients
    finally:
        for c in clients:
            await c.close()


async def fill(c: RawClient, addr: str, topic: str, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        assert (await c.send(addr, topic, b"m", 0, {UNIQ_KEY: f"{topic}-{i}"})).code == 0
    deadline = time.monotonic() + 10
    while True:
        r = await c.call(addr, C.GET_MAX_OFFSET, TopicQueueHeader(topic, 0).fields())
        if int(r.ext_fields["offset"]) >= start + n:
            return
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


async def commit(c: RawClient, addr: str, group: str, topic: str, offset: int) -> None:
    h = QueueOffsetHeader(group, topic, 0, offset)
    assert (await c.call(addr, C.UPDATE_CONSUMER_OFFSET, h.fields())).code == R.SUCCESS


async def pull(
    c: RawClient, addr: str, group: str, topic: str, offset: int, suspend_ms: int = 0
) -> tuple[RemotingCommand, list[str]]:
    resp, msgs = await c.pull(addr, topic, 0, offset, group=group, suspend_ms=suspend_ms)
    return resp, [m.uniq_key or "" for m in msgs]


async def stats(c: RawClient, addr: str, group: str, topic: str) -> dict[str, Any]:
    r = await c.call(addr, C.GET_CONSUME_STATS, TopicHeader(topic, group).fields())
    assert r.code == R.SUCCESS, r.remark
    row: dict[str, Any] = decode_json(r.body, "stats")["offsetTable"][0]
    return row


def test_new_owner_is_held_back_until_the_old_one_acked(locked: Cluster) -> None:
    addr = locked.addr(MASTER)

    async def t() -> None:
        async with consumers(addr, "GL", "QL", "A", "B") as (a, b):
            await fill(a, addr, "QL", 5)
            resp, got = await pull(a, addr, "GL", "QL", 0)
            assert resp.code == R.SUCCESS and len(got) == 5  # A holds the queue, 0..4 delivered
            # B (say, the new owner after a rebalance) is held back: nothing delivered twice.
            t0 = time.monotonic()
            resp, got = await pull(b, addr, "GL", "QL", 0, suspend_ms=500)
            assert resp.code == R.PULL_NOT_FOUND and got == []
            assert "locked by A" in (resp.remark or "") and 0.4 < time.monotonic() - t0 < 3
            assert resp.ext_fields["nextBeginOffset"] == "0"
            await commit(a, addr, "GL", "QL", 3)  # A acked 3 of 5: still held back
            resp, got = await pull(b, addr, "GL", "QL", 0)
            assert resp.code == R.PULL_NOT_FOUND and got == []
            row = await stats(b, addr, "GL", "QL")
            assert row["accessLock"]["clientId"] == "A"
            assert row["accessLock"]["deliveredOffset"] == 5
            assert row["accessLock"]["refusedPulls"] == 2
            await commit(a, addr, "GL", "QL", 5)  # A acked all it got: B may take over ...
            resp, got = await pull(b, addr, "GL", "QL", 0)
            # ... and is moved past what A acked instead of getting it again (DeFiBus).
            assert resp.code == R.PULL_NOT_FOUND and got == []
            assert resp.ext_fields["nextBeginOffset"] == "5"
            assert "lock a queue success" in (resp.remark or "")
            await fill(a, addr, "QL", 2, start=5)
            resp, got = await pull(b, addr, "GL", "QL", 5)
            assert got == ["QL-5", "QL-6"]
            # Now A is the one held back; B goes idle, and past the hold time A gets it back.
            resp, got = await pull(a, addr, "GL", "QL", 5)
            assert resp.code == R.PULL_NOT_FOUND and "locked by B" in (resp.remark or "")
            await asyncio.sleep(HOLD_MS / 1000 + 0.3)
            resp, got = await pull(a, addr, "GL", "QL", 5)
            assert got == ["QL-5", "QL-6"]  # B never acked: these are delivered again
            row = await stats(a, addr, "GL", "QL")
            assert row["accessLock"]["clientId"] == "A" and row["accessLock"]["transfers"] == 2
            info = await a.call(addr, C.GET_BROKER_RUNTIME_INFO)
            table = decode_json(info.body, "runtime")["table"]
            assert table["queueAccessLock"] == "True"
            assert int(table["accessLockRefusedPulls"]) >= 3
            assert decode_json(table["accessLockTransfers"].encode(), "t") == {
                "acked": 1,
                "timeout": 1,
            }

    run(t())


def test_a_holder_that_leaves_frees_the_queue_and_strangers_are_not_locked(
    locked: Cluster,
) -> None:
    addr = locked.addr(MASTER)

    async def t() -> None:
        async with consumers(addr, "GX", "QX", "A", "B") as (a, b):
            await fill(a, addr, "QX", 3)
            assert len((await pull(a, addr, "GX", "QX", 0))[1]) == 3
            assert (await pull(b, addr, "GX", "QX", 0))[1] == []
            await a.close()  # A's connection closes: it leaves the group, its hold ends
            await asyncio.sleep(0.3)
            resp, got = await pull(b, addr, "GX", "QX", 0)
            assert got == ["QX-0", "QX-1", "QX-2"], resp.remark
        # A client that never sent a heartbeat is not subject to the lock (as DeFiBus).
        stranger = RawClient()
        try:
            assert len((await pull(stranger, addr, "GX", "QX", 0))[1]) == 3
        finally:
            await stranger.close()

    run(t())


def test_orderly_lock_batch_and_unlock(locked: Cluster) -> None:
    addr = locked.addr(MASTER)

    async def lock(c: RawClient, code: int, client: str, qids: list[int]) -> list[int]:
        body = LockBatchRequestBody("GO", client, [("QO", "broker-a", q) for q in qids])
        r = await c.call(addr, code, body=body.encode())
        assert r.code == R.SUCCESS, r.remark
        return [q for _, _, q in decode_lock_ok(r.body)] if code == C.LOCK_BATCH_MQ else []

    async def t() -> None:
        c = RawClient()
        try:
            await fill(c, addr, "QO", 1)
            assert await lock(c, C.LOCK_BATCH_MQ, "A", [0, 1]) == [0, 1]
            assert await lock(c, C.LOCK_BATCH_MQ, "B", [1, 2]) == [2]
            assert await lock(c, C.LOCK_BATCH_MQ, "A", [0, 1]) == [0, 1]  # renewed
            await lock(c, C.UNLOCK_BATCH_MQ, "B", [1])  # not B's: nothing happens
            assert await lock(c, C.LOCK_BATCH_MQ, "B", [1]) == []
            await lock(c, C.UNLOCK_BATCH_MQ, "A", [1])
            assert await lock(c, C.LOCK_BATCH_MQ, "B", [1]) == [1]
            row = await stats(c, addr, "GO", "QO")
            assert row["orderLock"]["clientId"] == "A" and row["orderLock"]["expired"] is False
            bad = await c.call(addr, C.LOCK_BATCH_MQ, body=b'{"consumerGroup": "GO"}')
            assert bad.code == R.SYSTEM_ERROR and "clientId" in (bad.remark or "")
        finally:
            await c.close()

    run(t())


def test_without_the_lock_a_second_owner_gets_the_same_messages(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    with running_cluster(
        tmp_path_factory.mktemp("nolock") / "c", name_servers=1, slaves=False
    ) as cluster:
        addr = cluster.addr(MASTER)

        async def t() -> None:
            async with consumers(addr, "GN", "QN", "A", "B") as (a, b):
                await fill(a, addr, "QN", 4)
                assert len((await pull(a, addr, "GN", "QN", 0))[1]) == 4
                _, got = await pull(b, addr, "GN", "QN", 0)
                assert got == ["QN-0", "QN-1", "QN-2", "QN-3"]  # delivered twice
                row = await stats(a, addr, "GN", "QN")
                assert "accessLock" not in row

        run(t())
