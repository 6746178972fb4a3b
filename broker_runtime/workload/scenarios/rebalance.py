"""Two consumers owning one queue: from disagreeing route views, and during a
rebalance with the queue access lock off and on."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from broker_runtime.client.admin import MQAdmin
from broker_runtime.workload.harness import WorkloadError
from broker_runtime.workload.scenarios.common import (
    Ctx,
    consumed_by,
    delivery_stats,
    group_findings,
    queue_of,
)

RUN_TIME_S = 4.0  # how long the first consumer alone would take for all the messages
THREADS = 2


async def namesrv_split(c: Ctx) -> dict[str, Any]:
    h, m = c.h, c.plan.messages
    group = c.group()
    async with MQAdmin(c.namesrv) as admin:
        brokers = sorted(await admin.masters())
    if len(brokers) < 2:
        raise WorkloadError(f"{c.name} needs two broker groups; the cluster has {brokers}")
    first, second = brokers[0], brokers[1]
    await h.create_topic(c.namesrv, c.topic, 4, [first])
    # c2 reads the route now, while only `first` serves the topic, and keeps that view: its
    # name server poll (RocketMQ's default is 30 s; 120 s here, for a loaded machine) does
    # not come round before it leaves.
    c2 = c.consumer("c2", group, poll_namesrv_s=120.0)
    c1 = c.consumer("c1", group, wait_signal=True)  # loads now, reads the route when released
    await h.until(lambda: len(c2.state.owns) == 4, 30, "c2 to own the topic's queues", [c2])
    await h.create_topic(c.namesrv, c.topic, 4, [first, second])
    await h.release(c1)

    # Every queue seen owned by both until c2 leaves: a rebalance is journaled as it goes, so
    # the first overlap seen may be part of one.
    owned_twice: set[tuple[str, str, int]] = set()

    def split() -> bool:
        owned_twice.update(c1.state.owns & c2.state.owns)
        return bool(owned_twice)

    await h.until(split, 30, "c1 and c2 to both own a queue", [c1, c2])
    sent = await c.produce(range(m))

    def own_done() -> bool:
        split()
        for p in (c1, c2):
            mine = {s.index for s in sent if s.position and queue_of(s.position) in p.state.owns}
            if not p.state.consumed() >= mine:
                return False
        return True

    await h.until(own_done, c.patience(60), "each consumer to consume its queues", [c1, c2])
    both = sorted(owned_twice)
    h.say(f"{c.name}: c1 and c2 both owned {[q[1:] for q in both]}")
    await c2.stop()  # c1 is told the group changed, rebalances alone and takes every queue
    await h.until(
        lambda: consumed_by([c1]) >= set(range(m)), c.patience(60), "c1 to consume the rest", [c1]
    )
    await asyncio.sleep(0.3)
    await c1.stop()
    findings = group_findings(group, c.topic, [c1, c2])
    injected = {
        "fault": "two consumers of one group rebalance from different route views",
        "stale_consumer": c2.state.client,
        "stale_view": [first],
        "fresh_consumer": c1.state.client,
        "fresh_view": [first, second],
        "queues_owned_twice": [list(q) for q in both],
    }
    return c.result(
        "Name server disagreement: consumer c2 took the topic's route while only "
        f"{first} served it and rebalances from that view (4 queues); c1 has the full view "
        f"({first} and {second}, 8 queues). Allocating AVG over different queue lists, both "
        "take the same queues and both consume what arrives there, until c2 leaves.",
        [group], injected, findings, delivery_stats([c1, c2], findings),
    )  # fmt: skip


async def rebalance(c: Ctx, lock: bool) -> dict[str, Any]:
    h, m = c.h, c.plan.messages
    join = int(c.plan.params["second_consumer_at_index"])
    group = c.group()
    master = next(n for n in h.layout_of(c.root).nodes if n.role == "master")
    await h.create_topic(c.namesrv, c.topic, 4, [str(master.group)])
    upfront = (m * 3) // 5  # the rest is sent once b is in the group
    await c.produce(range(upfront))
    delay_ms = RUN_TIME_S * 1000 * THREADS / m
    # A handover waits for the pull the old owner has waiting at the broker: 1 s long polls.
    spec: dict[str, Any] = {
        "handover": True, "threads": THREADS, "delay_ms": delay_ms, "suspend_ms": 1000,
    }  # fmt: skip
    a = c.consumer("a", group, **spec)
    b = c.consumer("b", group, wait_signal=True, **spec)
    h.say(f"{c.name}: topic created, {upfront} messages sent")
    await h.until(lambda: b.state.ready, 30, "consumer b to load", [a, b])
    await h.until(
        lambda: len(consumed_by([a])) >= join, c.patience(60), f"a to consume {join}", [a, b]
    )
    await h.release(b)
    h.say(f"{c.name}: b joins after a consumed {len(consumed_by([a]))} of {m}")
    await h.until(lambda: bool(b.state.owns), 30, "b to own queues", [a, b])
    await c.produce(range(upfront, m))
    await h.until(
        lambda: consumed_by([a, b]) >= set(range(m)), c.patience(90), "all consumed", [a, b]
    )
    h.say(f"{c.name}: all consumed")
    await asyncio.sleep(1.0)  # handovers finish and commit
    await b.stop()
    await a.stop()
    h.say(f"{c.name}: consumers stopped")
    info = await h.runtime(master.addr)
    findings = group_findings(group, c.topic, [a, b])
    stats = delivery_stats([a, b], findings)
    stats["broker"] = {
        k: info.get(k)
        for k in ("queueAccessLock", "accessLockRefusedPulls", "accessLockTransfers")
        if k in info
    }
    if "accessLockTransfers" in info:
        stats["broker"]["accessLockTransfers"] = json.loads(info["accessLockTransfers"])
    state = "on" if lock else "off"
    injected = {
        "fault": "a second consumer joins the group while the first has messages in flight",
        "queue_access_lock": lock,
        "second_consumer_after": join,
        "sent_before_it_joined": upfront,
        "listener_delay_ms": round(delay_ms, 2),
    }
    return c.result(
        f"Rebalance with the queue access lock {state}. Consumer a has pulled the "
        "topic's first messages and works through them slowly; b joins and takes half the "
        "queues, then the rest of the messages are sent. Both consumers finish and ack what "
        "they pulled of a queue they give up (as DeFiBus clients do). "
        + (
            "The broker holds b back on those queues until a's acks reach what it was "
            "delivered, then b goes on from there: few or no duplicates."
            if lock
            else "Without the lock b pulls them at once from the last committed offset, "
            "while a is still consuming what it pulled: those messages are delivered twice."
        ),
        [group], injected, findings, stats,
    )  # fmt: skip


async def rebalance_lock_off(c: Ctx) -> dict[str, Any]:
    return await rebalance(c, lock=False)


async def rebalance_lock_on(c: Ctx) -> dict[str, Any]:
    return await rebalance(c, lock=True)
