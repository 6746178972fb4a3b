"""A virtual host's topology as the management API reports it, with the time it was read.

`fetch_snapshot(api_url, vhost)` reads `/api/exchanges`, `/api/queues`, `/api/bindings` and
`/api/policies` of one virtual host; `parse_snapshot` (pure) turns those JSON lists into a
routing `Topology` plus each queue's dead-letter, TTL and length settings. A queue argument
wins over a policy for the dead-letter exchange, its routing key and the overflow mode; for
TTL and length limits the lower of the two applies, as the broker does. An exchange's
alternate exchange is its `alternate-exchange` argument, else its policy's. A void binding
argument (the API shows it as "undefined") is VOID.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from broker_runtime.rabbit.routing import VOID, Binding, Exchange, Topology

JsonList = Sequence[Mapping[str, Any]]
_MIN_OF_BOTH = {"message-ttl", "max-length", "max-length-bytes", "delivery-limit"}


@dataclass(frozen=True)
class QueueSettings:
    """What decides whether a queue drops, expires or dead-letters a message."""

    name: str
    queue_type: str = "classic"
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    message_ttl: int | None = None
    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: str = "drop-head"  # drop-head, reject-publish or reject-publish-dlx
    delivery_limit: int | None = None


@dataclass(frozen=True)
class Snapshot:
    vhost: str
    taken_at_ms: int
    topology: Topology
    queues: Mapping[str, QueueSettings]


def parse_snapshot(
    vhost: str,
    taken_at_ms: int,
    exchanges: JsonList,
    queues: JsonList,
    bindings: JsonList,
    policies: JsonList = (),
) -> Snapshot:
    """The snapshot of `vhost` from the management API's JSON lists (other vhosts' entries
    are left out)."""
    defs = {p["name"]: p.get("definition") or {} for p in policies if p.get("vhost") == vhost}
    xs: dict[str, Exchange] = {}
    for x in exchanges:
        if x.get("vhost", vhost) != vhost or x["name"] == "":
            continue  # the default exchange routes by queue name, not by bindings
        args = x.get("arguments") or {}
        alternate = args.get("alternate-exchange") or defs.get(x.get("policy") or "", {}).get(
            "alternate-exchange"
        )
        xs[x["name"]] = Exchange(x["name"], x["type"], alternate)
    settings: dict[str, QueueSettings] = {}
    for q in queues:
        if q.get("vhost", vhost) != vhost:
            continue
        settings[q["name"]] = _queue_settings(q, defs.get(q.get("policy") or "", {}))
    bs = tuple(
        Binding(
            b["source"],
            b["destination"],
            "exchange" if b["destination_type"] == "exchange" else "queue",
            b.get("routing_key", ""),
            tuple(sorted((k, _value(v)) for k, v in (b.get("arguments") or {}).items())),
        )
        for b in bindings
        if b.get("vhost", vhost) == vhost and b["source"] != ""
    )
    return Snapshot(vhost, taken_at_ms, Topology(xs, frozenset(settings), bs), settings)


def _value(v: Any) -> Any:
    """A binding argument as the API gives it: a void one comes as the string "undefined"
    (Erlang's atom), indistinguishable from that string itself, and is read as VOID."""
    return VOID if v == "undefined" else v


def _queue_settings(q: Mapping[str, Any], policy: Mapping[str, Any]) -> QueueSettings:
    args = q.get("arguments") or {}
    policy = q.get("effective_policy_definition") or policy

    def pick(key: str) -> Any:
        mine, theirs = args.get(f"x-{key}"), policy.get(key)
        if key in _MIN_OF_BOTH and mine is not None and theirs is not None:
            return min(int(mine), int(theirs))
        return mine if mine is not None else theirs

    return QueueSettings(
        q["name"],
        str(args.get("x-queue-type") or q.get("type") or "classic"),
        pick("dead-letter-exchange"),
        pick("dead-letter-routing-key"),
        pick("message-ttl"),
        pick("max-length"),
        pick("max-length-bytes"),
        str(pick("overflow") or "drop-head"),
        pick("delivery-limit"),
    )


def fetch_snapshot(
    api_url: str, vhost: str, user: str = "guest", password: str = "guest", timeout_s: float = 30
) -> Snapshot:
    """Read the topology of `vhost` from the management API at `api_url` (`http://h:p/api`).

    The time is taken before the reads: what the snapshot holds was in force then or later.
    """
    taken = int(time.time() * 1000)
    quoted = urllib.parse.quote(vhost, safe="")
    token = base64.b64encode(f"{user}:{password}".encode()).decode()

    def get(what: str) -> list[dict[str, Any]]:
        request = urllib.request.Request(f"{api_url.rstrip('/')}/{what}/{quoted}")
        request.add_header("Authorization", f"Basic {token}")
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            data: list[dict[str, Any]] = json.loads(response.read())
        return data

    return parse_snapshot(
        vhost, taken, get("exchanges"), get("queues"), get("bindings"), get("policies")
    )
