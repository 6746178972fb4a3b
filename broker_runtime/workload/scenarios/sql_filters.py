"""The transactions scenario's SQL92 filter consumers (broker_runtime/workload/filters.py),
on a topic of their own beside the transactions' (TOPIC-sql), on the same cluster.

Every group's consumer processes start first; once each group's instances hold the topic's
queues between them (no rebalance moves a queue while messages flow), the messages are sent,
message i to queue i % 4, with their properties and tags. The run ends when every group's
committed offset has passed every message (a stale tag instance's offset passes what the
broker skipped for it), and the consumers stop cleanly. The truth then lists, per group, the
msg_ids its Python rule expects and the `filtered_wrongly` findings of what its instances got.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from broker_runtime.client.config import ClientConfig
from broker_runtime.client.model import SendStatus, new_message
from broker_runtime.client.msg_id import set_uniq_id
from broker_runtime.client.producer import Producer
from broker_runtime.common.constants import SQL92
from broker_runtime.workload import filters as FL
from broker_runtime.workload.harness import ConsumerProc, WorkloadError
from broker_runtime.workload.scenarios.common import Ctx, QueueKey, committed, deliveries
from broker_runtime.workload.truth import Finding, delivery_findings

SUSPEND_MS = 1000  # a pull over filtered-out messages returns (and moves the offset) soon


@dataclass
class FilterRun:
    topic: str
    procs: dict[str, list[ConsumerProc]]  # group name -> its instances (SQL92 one first)
    sent: dict[str, FL.Props] = field(default_factory=dict)  # msg_id -> its values

    def groups(self) -> list[tuple[FL.FilterGroup, str]]:
        return list(zip(FL.FILTER_GROUPS, self.procs, strict=True))

    def all_procs(self) -> list[ConsumerProc]:
        return [p for ps in self.procs.values() for p in ps]


async def start(c: Ctx) -> FilterRun:
    """The filter topic and every group's consumer processes (started, not yet waited on)."""
    topic = f"{c.topic}-sql"
    await c.h.create_topic(c.namesrv, topic, queues=FL.QUEUES)
    procs: dict[str, list[ConsumerProc]] = {}
    for g in FL.FILTER_GROUPS:
        name = c.group(f"-{g.suffix}")
        spec = {"suspend_ms": SUSPEND_MS, "rebalance_interval_s": 5.0}
        mine = [
            c.consumer(
                g.suffix, name, topic, expression=g.expression, expression_type=SQL92, **spec
            )
        ]
        if g.stale is not None:
            mine.append(c.consumer(f"{g.suffix}-stale", name, topic, expression=g.stale, **spec))
        procs[name] = mine
    return FilterRun(topic, procs)


def _balanced(run: FilterRun) -> bool:
    """Every group's instances each hold queues, none twice, all of them between them."""
    for ps in run.procs.values():
        owned = [p.state.owns for p in ps]
        if not all(owned) or sum(map(len, owned)) != FL.QUEUES:
            return False
        if len(set().union(*owned)) != FL.QUEUES:
            return False
    return True


async def run(c: Ctx, fr: FilterRun) -> None:
    """Send the filter messages once the groups are balanced; until every offset passed them."""
    procs = fr.all_procs()
    await c.h.until(lambda: _balanced(fr), c.patience(60), "the filter groups to balance", procs)
    values = FL.draw(c.plan.seed, c.plan.messages)
    producer = Producer(ClientConfig(c.namesrv), c.group("-sql-producer"))
    await producer.start()
    ends: dict[QueueKey, int] = {}
    try:
        for i, p in enumerate(values):
            msg = new_message(
                fr.topic, c.h.body(f"{c.name}-sql", i), tags=p.tag, keys=f"{c.name}-sql-{i}",
                properties=p.properties(),
            )  # fmt: skip
            set_uniq_id(msg)
            r = await producer.send_orderly(msg, i)  # queue i % 4 (Integer.hashCode is i)
            if r.status is not SendStatus.SEND_OK:
                raise WorkloadError(f"{c.name}: filter message {i}: {r.status.value}")
            fr.sent[r.msg_id] = p
            key = (r.mq.topic, r.mq.broker, r.mq.queue_id)
            ends[key] = max(ends.get(key, 0), r.queue_offset + 1)
    finally:
        await producer.shutdown()
    c.h.say(f"{c.name}: {len(values)} filter messages sent to {fr.topic}")
    deadline = asyncio.get_running_loop().time() + c.patience(60)
    for group in fr.procs:
        while True:
            done = await committed(c.namesrv, group, fr.topic)
            if all(done.get(q, -1) >= end for q, end in ends.items()):
                break
            if asyncio.get_running_loop().time() > deadline:
                raise WorkloadError(f"{c.name}: {group}'s offsets did not pass {ends}: {done}")
            if not all(p.alive() for p in fr.procs[group]):
                raise WorkloadError(f"{c.name}: a consumer of {group} exited")
            await asyncio.sleep(0.3)
    await asyncio.gather(*(p.stop() for p in procs))


def findings(fr: FilterRun) -> list[Finding]:
    """Every group's filtered_wrongly findings, and any duplicate its deliveries made."""
    out: list[Finding] = []
    for g, name in fr.groups():
        ds = deliveries(fr.procs[name])
        out += FL.filter_findings(g, name, fr.topic, fr.sent, ds)
        out += delivery_findings(name, fr.topic, ds)
    return out
