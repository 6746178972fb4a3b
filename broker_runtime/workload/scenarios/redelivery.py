"""Redelivery after a consumer dies: holding an unacked message, or after
its acks were lost on the way. Both on the main cluster."""

from __future__ import annotations

import asyncio
from typing import Any

from broker_runtime.workload.harness import WorkloadError
from broker_runtime.workload.scenarios.common import (
    Ctx,
    QueueKey,
    committed,
    consumed_by,
    delivery_stats,
    ends,
    group_findings,
    queue_of,
)

SETTLE_S = 1.5  # a few persist intervals: every commit sent has arrived


async def _offsets_reach(c: Ctx, group: str, want: dict[QueueKey, int]) -> None:
    """Until the group's committed offsets on the broker are at least `want`. A queue with
    no committed offset (-1) counts as 0: the group starts it from the beginning, and a
    consumer commits 0 only by persisting (it never rides on a pull, as in RocketMQ)."""
    deadline = asyncio.get_running_loop().time() + 30
    while True:
        got = await committed(c.namesrv, group, c.topic)
        if all(max(got.get(q, -1), 0) >= off for q, off in want.items()):
            return
        if asyncio.get_running_loop().time() > deadline:
            raise WorkloadError(f"{c.name}: committed offsets {got} never reached {want}")
        await asyncio.sleep(0.2)


async def consumer_crash_unacked(c: Ctx) -> dict[str, Any]:
    h, m = c.h, c.plan.messages
    hold = int(c.plan.params["hold_index"])
    group = c.group()
    await h.create_topic(c.namesrv, c.topic)
    sent = await c.produce(range(m))
    held = sent[hold]
    assert held.position is not None
    held_q, held_off = queue_of(held.position), held.position[3]
    h.say(f"{c.name}: consumer a hangs on message {hold} ({held_q} @ {held_off})")
    a = c.consumer("a", group, hang=[hold])
    b = c.consumer("b", group, wait_signal=True)  # loads now, joins the group after the kill
    others = set(range(m)) - {hold}
    await h.until(
        lambda: consumed_by([a]) >= others and any(d.index == hold for d in a.state.deliveries),
        c.patience(60), "consumer a to finish all but the held message", [a],
    )  # fmt: skip
    want = {q: (held_off if q == held_q else end) for q, end in ends(sent).items()}
    await _offsets_reach(c, group, want)
    await a.kill()  # kill -9 while it holds the lowest unacked offset of its queue
    h.say(f"{c.name}: consumer a killed; b takes over")
    await h.release(b)
    again = {
        s.index
        for s in sent
        if s.position and queue_of(s.position) == held_q and s.position[3] >= held_off
    }
    await h.until(lambda: consumed_by([b]) >= again, c.patience(60), "consumer b to redeliver", [b])
    await asyncio.sleep(0.3)
    await b.stop()
    findings = group_findings(group, c.topic, [a, b])
    injected = {
        "fault": "consumer a killed (SIGKILL) while its listener held one message unacked",
        "held_index": hold,
        "held_msg_id": held.msg_id,
        "held_queue": list(held_q),
        "held_queue_offset": held_off,
    }
    return c.result(
        "A consumer is killed with SIGKILL while it holds the lowest unacked offset of a queue: "
        "it finished the messages after it, but the queue's offset could not "
        "pass the held one. The next consumer starts from there: the held message is "
        "redelivered after the restart, the ones after it were consumed and are delivered "
        "again (their offset was never committed).",
        [group], injected, findings, delivery_stats([a, b], findings),
    )  # fmt: skip


async def ack_lost(c: Ctx) -> dict[str, Any]:
    h, m = c.h, c.plan.messages
    frm = int(c.plan.params["ack_lost_from_index"])
    group = c.group()
    await h.create_topic(c.namesrv, c.topic)
    sent = await c.produce(range(m))
    pos = sent[frm].position
    assert pos is not None
    lossy_q, lossy_off = queue_of(pos), pos[3]
    h.say(f"{c.name}: acks of {lossy_q} past offset {lossy_off} will be lost")
    a = c.consumer("a", group, lose_acks=[*lossy_q, lossy_off])
    b = c.consumer("b", group, wait_signal=True)  # loads now, joins the group after the kill
    await h.until(
        lambda: consumed_by([a]) >= set(range(m)), c.patience(60), "consumer a to consume all", [a]
    )
    want = {q: end for q, end in ends(sent).items() if q != lossy_q}
    await _offsets_reach(c, group, want)
    await asyncio.sleep(SETTLE_S)
    at_kill = await committed(c.namesrv, group, c.topic)
    await a.kill()
    restart_from = max(0, at_kill.get(lossy_q, -1))
    h.say(f"{c.name}: consumer a killed; its queue {lossy_q} stands at {restart_from}")
    await h.release(b)
    again = {
        s.index
        for s in sent
        if s.position and queue_of(s.position) == lossy_q and s.position[3] >= restart_from
    }
    await h.until(lambda: consumed_by([b]) >= again, c.patience(60), "consumer b to redeliver", [b])
    await asyncio.sleep(0.3)
    await b.stop()
    findings = group_findings(group, c.topic, [a, b])
    lost_acks = [o for _, o in a.state.acks_lost]
    injected = {
        "fault": "offset commits (acks) of one queue past an offset dropped on the way",
        "queue": list(lossy_q),
        "acks_lost_past_offset": lossy_off,
        "acks_lost": len(lost_acks),
        "committed_at_kill": restart_from,
    }
    return c.result(
        "A consumer processes every message, but its acks (offset commits) of one queue past "
        "an offset never reach the broker; then it dies (SIGKILL). The next consumer resumes "
        "that queue from the last ack that arrived: messages already consumed are delivered "
        "again (ack lost after processing).",
        [group], injected, findings, delivery_stats([a, b], findings),
    )  # fmt: skip
