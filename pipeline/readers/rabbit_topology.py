"""RabbitMQ topology snapshots <-> rows of the lake's `rabbit_topology` table.

A snapshot is a row per exchange, queue and binding, all with its virtual host and time
(`snapshot_ts`); binding arguments are kept as JSON (a void argument as null, which the
matcher reads as void again).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from broker_runtime.rabbit.routing import VOID, Binding, Exchange, Topology, Void
from broker_runtime.rabbit.topology import QueueSettings, Snapshot

_EMPTY = {
    "type": None, "alternate": None, "source": None, "destination": None,
    "destination_type": None, "routing_key": None, "arguments": None,
    "dead_letter_exchange": None, "dead_letter_routing_key": None, "message_ttl": None,
    "max_length": None, "max_length_bytes": None, "overflow": None, "delivery_limit": None,
}  # fmt: skip


def snapshot_rows(snap: Snapshot) -> list[dict[str, Any]]:
    """The table's rows of one snapshot."""
    head = {"vhost": snap.vhost, "snapshot_ts": snap.taken_at_ms}
    rows: list[dict[str, Any]] = []
    for x in snap.topology.exchanges.values():
        rows.append(
            {**head, **_EMPTY, "kind": "exchange", "name": x.name, "type": x.type,
             "alternate": x.alternate}
        )  # fmt: skip
    for q in snap.queues.values():
        rows.append(
            {**head, **_EMPTY, "kind": "queue", "name": q.name, "type": q.queue_type,
             "dead_letter_exchange": q.dead_letter_exchange,
             "dead_letter_routing_key": q.dead_letter_routing_key,
             "message_ttl": q.message_ttl, "max_length": q.max_length,
             "max_length_bytes": q.max_length_bytes, "overflow": q.overflow,
             "delivery_limit": q.delivery_limit}
        )  # fmt: skip
    for b in snap.topology.bindings:
        args = json.dumps(
            {k: None if isinstance(v, Void) else v for k, v in b.arguments}, sort_keys=True,
            default=str,
        )  # fmt: skip
        rows.append(
            {**head, **_EMPTY, "kind": "binding",
             "name": f"{b.source}>{b.destination_type}:{b.destination}:{b.routing_key}:{args}",
             "source": b.source, "destination": b.destination,
             "destination_type": b.destination_type, "routing_key": b.routing_key,
             "arguments": args}
        )  # fmt: skip
    return rows


def _arguments(text: str | None) -> tuple[tuple[str, Any], ...]:
    args = json.loads(text or "{}")
    return tuple(sorted((k, VOID if v is None else v) for k, v in args.items()))


def snapshots_from_rows(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, int], Snapshot]:
    """Snapshots by (vhost, snapshot_ts) from the table's rows."""
    grouped: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for r in rows:
        grouped.setdefault((r["vhost"], int(r["snapshot_ts"])), []).append(r)
    out = {}
    for (vhost, ts), items in grouped.items():
        xs = {
            r["name"]: Exchange(r["name"], r["type"], r["alternate"])
            for r in items
            if r["kind"] == "exchange"
        }
        qs = {
            r["name"]: QueueSettings(
                r["name"], r["type"] or "classic", r["dead_letter_exchange"],
                r["dead_letter_routing_key"], r["message_ttl"], r["max_length"],
                r["max_length_bytes"], r["overflow"] or "drop-head", r["delivery_limit"],
            )
            for r in items
            if r["kind"] == "queue"
        }  # fmt: skip
        bs = tuple(
            Binding(
                r["source"], r["destination"],
                "exchange" if r["destination_type"] == "exchange" else "queue",
                r["routing_key"] or "", _arguments(r["arguments"]),
            )
            for r in items
            if r["kind"] == "binding"
        )  # fmt: skip
        out[(vhost, ts)] = Snapshot(vhost, ts, Topology(xs, frozenset(qs), bs), qs)
    return out
