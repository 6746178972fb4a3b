"""A producer resend after a lost answer (stored twice) and sends that never reach the broker
(left UNCONFIRMED for the resend job), and consumers failing messages for good (retry, then
the DLQ) or for a while (retry, then success). On the main cluster."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from broker_runtime.client.admin import MQAdmin
from broker_runtime.common.findings import DEAD_LETTERED
from broker_runtime.common.topics import dlq_topic
from broker_runtime.workload.harness import WorkloadError
from broker_runtime.workload.scenarios.common import (
    Ctx,
    consumed_by,
    delivery_stats,
    group_findings,
)
from broker_runtime.workload.truth import finding, stored_twice_findings


async def producer_resend(c: Ctx) -> dict[str, Any]:
    h, m = c.h, c.plan.messages
    victims = [int(i) for i in c.plan.params["lost_responses"]]
    cut_off = [int(i) for i in c.plan.params.get("unreachable", [])]
    group = c.group()
    await h.create_topic(c.namesrv, c.topic)
    sent = await c.produce(range(m), lose_response_of=victims, unreachable=cut_off)
    twice = [s for s in sent if len(s.copies) >= 2]
    h.say(f"{c.name}: {len(twice)} of {len(victims)} lost answers made a second copy")
    h.say(f"{c.name}: {len(cut_off)} sends never reached the broker")
    a = c.consumer("a", group)
    copies = sum(len(s.copies) for s in sent)
    stored = set(range(m)) - set(cut_off)

    def all_copies() -> bool:
        return len(a.state.deliveries) >= copies and consumed_by([a]) >= stored

    await h.until(all_copies, c.patience(60), "every stored copy to be consumed", [a])
    await asyncio.sleep(0.3)
    await a.stop()
    positions: dict[str, list[tuple[str, str, int, int]]] = {s.msg_id: list(s.copies) for s in sent}
    for d in a.state.deliveries:  # what the consumer found stored counts too
        positions.setdefault(d.msg_id, []).append(d.position)
    findings = stored_twice_findings(positions, c.topic) + group_findings(group, c.topic, [a])
    injected = {
        "fault": "the answer to the first send attempt dropped (a timeout for the producer); "
        "every request of other sends dropped before the broker (a cut-off network)",
        "lost_answers": len(victims),
        "indexes": victims,
        "msg_ids": [sent[i].msg_id for i in victims],
        "unreachable_indexes": cut_off,
        "unreachable_msg_ids": [sent[i].msg_id for i in cut_off],
    }
    return c.result(
        "The broker stores a message and answers, but the answer is lost: the producer times "
        "out and sends again, and the message is stored twice with the same UNIQ_KEY (seed "
        "002 6.1.2.1). A consumer group then gets both copies. Other sends never reach the "
        "broker: they fail, nothing is stored, and their ledger stubs stay UNCONFIRMED until "
        "the resend job sends them again.",
        [group], injected, findings, delivery_stats([a], findings),
    )  # fmt: skip


async def consumer_failures(c: Ctx) -> dict[str, Any]:
    h, m, p = c.h, c.plan.messages, c.plan.params
    permanent = [int(i) for i in p["permanent"]]
    transient = {int(k): int(v) for k, v in p["transient"].items()}
    max_times = int(p["max_reconsume"])
    group = c.group()
    await h.create_topic(c.namesrv, c.topic)
    sent = await c.produce(range(m))
    a = c.consumer(
        "a", group, fail_always=permanent, fail_times={str(k): v for k, v in transient.items()},
        retry_delay_level=int(p["retry_delay_level"]), max_reconsume=max_times,
    )  # fmt: skip
    ok = set(range(m)) - set(permanent)

    def settled() -> bool:
        failed = Counter(d.index for d in a.state.deliveries if d.outcome == "RECONSUME_LATER")
        return consumed_by([a]) >= ok and all(failed[i] > max_times for i in permanent)

    h.say(f"{c.name}: {len(permanent)} messages fail always, {len(transient)} for a while")
    await h.until(settled, c.patience(120), "retries and dead letters to settle", [a])
    dead = await _dead_letters(c, group, [sent[i].msg_id for i in permanent])
    await a.stop()
    findings = group_findings(group, c.topic, [a])
    findings += [finding(DEAD_LETTERED, mid, group, n, c.topic) for mid, n in sorted(dead.items())]
    injected = {
        "fault": "the listener returns RECONSUME_LATER: always for some messages, the first "
        "1-2 deliveries for others",
        "permanent_indexes": permanent,
        "transient_indexes": {str(k): v for k, v in transient.items()},
        "max_reconsume_times": max_times,
        "retry_delay_level": int(p["retry_delay_level"]),
    }
    stats = delivery_stats([a], findings)
    stats["sent_back"] = sum(1 for d in a.state.deliveries if d.outcome == "RECONSUME_LATER")
    return c.result(
        "A consumer fails some messages every time: each goes back to the broker "
        f"(%RETRY%{{group}}) and after {max_times} retries to the dead-letter queue "
        "%DLQ%{group}. It fails others once or twice, then consumes them: retried, then OK.",
        [group], injected, findings, stats,
    )  # fmt: skip


async def _dead_letters(c: Ctx, group: str, msg_ids: list[str]) -> dict[str, int]:
    """msg_id -> reconsume times of its copy in the group's DLQ (queried by UNIQ_KEY)."""
    topic = dlq_topic(group)
    found: dict[str, int] = {}
    deadline = asyncio.get_running_loop().time() + 30
    async with MQAdmin(c.namesrv) as admin:
        while len(found) < len(msg_ids):
            for mid in msg_ids:
                if mid in found:
                    continue
                try:
                    copies = await admin.query_by_key(topic, mid)
                except Exception:
                    copies = []  # the DLQ topic may not be routed yet
                if copies:
                    found[mid] = max(cp.reconsume_times for cp in copies)
            if len(found) < len(msg_ids):
                if asyncio.get_running_loop().time() > deadline:
                    missing = sorted(set(msg_ids) - set(found))
                    raise WorkloadError(f"{c.name}: not in {topic}: {missing[:5]}")
                await asyncio.sleep(0.3)
    return found
