"""What every scenario uses: its names, its consumers' common settings, the group's
deliveries from their journals, and the result it hands to the truth file."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker_runtime.client.admin import MQAdmin
from broker_runtime.common.findings import DELIVERED_TWICE, RESEND_DUE
from broker_runtime.workload.harness import ConsumerProc, Harness, Position, Sent, WorkloadError
from broker_runtime.workload.journal import Delivery
from broker_runtime.workload.plan import ScenarioPlan
from broker_runtime.workload.truth import Finding, delivery_findings, finding, scenario_entry

QueueKey = tuple[str, str, int]  # topic, broker, queue id


@dataclass
class Ctx:
    h: Harness
    plan: ScenarioPlan
    root: Path  # the data dir of the cluster the scenario runs on
    namesrv: str
    sent: list[Sent] = field(default_factory=list)  # every send of the scenario's producers

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def topic(self) -> str:
        return f"wl-{self.h.run_id}-{self.name.replace('_', '-')}"

    def group(self, suffix: str = "") -> str:
        return f"wl-{self.h.run_id}-{self.name.replace('_', '-')}{suffix}"

    def patience(self, base: float) -> float:
        """A timeout for consuming the scenario's messages: `base` seconds and 10 ms per
        message (a loaded machine still consumes a few hundred a second)."""
        return base + self.plan.messages / 100

    @property
    def ledger_dir(self) -> Path | None:
        return self.h.ledger_dir(self.root)

    def consumer(self, name: str, group: str, **spec: Any) -> ConsumerProc:
        """A consumer process of `group` on the scenario's topic, ledger on."""
        return self.h.consumer(
            self.name,
            name,
            namesrv=self.namesrv,
            group=group,
            topic=self.topic,
            instance=f"{self.name}-{name}",
            ledger_dir=str(self.ledger_dir) if self.ledger_dir else None,
            ledger_url=self.h.ledger_url,
            **spec,
        )

    async def produce(
        self, indexes: Sequence[int], unreachable: Sequence[int] = (), **kw: Any
    ) -> list[Sent]:
        """Send one message per index; a send may fail only where the broker is made
        `unreachable` for it (faults.py): any other failure is the workload's error."""
        sent = await self.h.produce(
            self.namesrv, self.topic, self.name, indexes, self.ledger_dir,
            unreachable=unreachable, **kw,
        )  # fmt: skip
        cut_off = set(unreachable)
        failed = [s for s in sent if s.status is None and s.index not in cut_off]
        if failed:
            raise WorkloadError(f"{self.name}: {len(failed)} send(s) failed: {failed[0].error}")
        arrived = [s.index for s in sent if s.index in cut_off and s.status is not None]
        if arrived:
            raise WorkloadError(f"{self.name}: sends {arrived} reached the cut-off broker")
        self.sent += sent
        return sent

    def resend_findings(self) -> list[Finding]:
        """Every send no SEND_OK answered: its stub stays UNCONFIRMED, due for a resend."""
        return [
            finding(RESEND_DUE, s.msg_id, None, 1, self.topic) for s in self.sent if not s.acked
        ]

    def result(
        self,
        description: str,
        groups: Sequence[str],
        injected: dict[str, Any],
        findings: Sequence[Finding],
        stats: dict[str, Any],
    ) -> dict[str, Any]:
        return scenario_entry(
            description=description,
            data_dir=str(self.root),
            topic=self.topic,
            groups=groups,
            messages=self.plan.messages,
            injected=injected,
            findings=[*findings, *self.resend_findings()],
            stats=stats,
        )


def queue_of(pos: Position) -> QueueKey:
    return pos[0], pos[1], pos[2]


def ends(sent: Iterable[Sent]) -> dict[QueueKey, int]:
    """Per queue, the offset after the last message sent there (a fresh topic starts at 0)."""
    out: dict[QueueKey, int] = {}
    for s in sent:
        for p in s.copies:
            out[queue_of(p)] = max(out.get(queue_of(p), 0), p[3] + 1)
    return out


def deliveries(procs: Iterable[ConsumerProc]) -> list[Delivery]:
    return [d for p in procs for d in p.state.deliveries]


def group_findings(group: str, topic: str, procs: Iterable[ConsumerProc]) -> list[Finding]:
    return delivery_findings(group, topic, deliveries(procs))


def consumed_by(procs: Iterable[ConsumerProc]) -> set[int]:
    out: set[int] = set()
    for p in procs:
        out |= p.state.consumed()
    return out


def delivery_stats(procs: Sequence[ConsumerProc], findings: Sequence[Finding]) -> dict[str, Any]:
    """Deliveries, the extra ones of delivered_twice messages, and messages CONSUMED more
    than once (the work done twice: the audit's duplicate_effect)."""
    ds = deliveries(procs)
    consumed = Counter(d.msg_id for d in ds if d.outcome == "CONSUMED")
    return {
        "deliveries": len(ds),
        "duplicate_deliveries": sum(
            f["count"] - 1 for f in findings if f["kind"] == DELIVERED_TWICE
        ),
        "duplicate_effects": sum(1 for n in consumed.values() if n > 1),
        "consumers": {p.name: len(p.state.deliveries) for p in procs},
    }


async def committed(namesrv: str, group: str, topic: str) -> dict[QueueKey, int]:
    """The group's committed offsets of `topic` on the brokers (-1: none)."""
    async with MQAdmin(namesrv) as admin:
        try:
            rows = await admin.consumer_progress(group, topic)
        except Exception:
            return {}
    return {
        (r["topic"], r["brokerName"], int(r["queueId"])): int(r["consumerOffset"]) for r in rows
    }
