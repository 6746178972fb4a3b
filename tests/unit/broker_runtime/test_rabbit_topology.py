"""Topology snapshots from management API JSON (pure), and their lake rows both ways."""

from __future__ import annotations

from broker_runtime.rabbit.routing import VOID, route
from broker_runtime.rabbit.topology import QueueSettings, parse_snapshot
from pipeline.readers.rabbit_topology import snapshot_rows, snapshots_from_rows

V = "shop"
EXCHANGES = [
    {"vhost": V, "name": "", "type": "direct", "arguments": {}},
    {"vhost": V, "name": "orders", "type": "topic", "arguments": {}, "policy": "ae"},
    {"vhost": V, "name": "own-ae", "type": "fanout", "arguments": {"alternate-exchange": "x"},
     "policy": "ae"},
    {"vhost": V, "name": "rest", "type": "fanout", "arguments": {}},
    {"vhost": "other", "name": "elsewhere", "type": "fanout", "arguments": {}},
]  # fmt: skip
QUEUES = [
    {"vhost": V, "name": "paid", "arguments": {"x-message-ttl": 5000, "x-max-length": 10},
     "policy": "limits", "type": "classic"},
    {"vhost": V, "name": "rest-q", "arguments": {"x-queue-type": "quorum"},
     "effective_policy_definition": {"dead-letter-exchange": "dlx", "delivery-limit": 3}},
]  # fmt: skip
BINDINGS = [
    {"vhost": V, "source": "", "destination": "paid", "destination_type": "queue",
     "routing_key": "paid", "arguments": {}},
    {"vhost": V, "source": "orders", "destination": "paid", "destination_type": "queue",
     "routing_key": "order.*.paid", "arguments": {}},
    {"vhost": V, "source": "rest", "destination": "rest-q", "destination_type": "queue",
     "routing_key": "", "arguments": {"x-match": "any", "a": "undefined"}},
]  # fmt: skip
POLICIES = [
    {"vhost": V, "name": "ae", "definition": {"alternate-exchange": "rest"}},
    {"vhost": V, "name": "limits", "definition": {"message-ttl": 1000, "max-length": 50,
                                                  "dead-letter-exchange": "dlx",
                                                  "overflow": "reject-publish"}},
]  # fmt: skip


def test_arguments_and_policies_combine_as_the_broker_does() -> None:
    snap = parse_snapshot(V, 123, EXCHANGES, QUEUES, BINDINGS, POLICIES)
    topo = snap.topology
    assert set(topo.exchanges) == {"orders", "own-ae", "rest"}  # no default, no other vhost
    assert topo.exchanges["orders"].alternate == "rest"  # from the policy
    assert topo.exchanges["own-ae"].alternate == "x"  # the argument wins
    # TTL and length: the lower of argument and policy; DLX and overflow from the policy.
    assert snap.queues["paid"] == QueueSettings(
        "paid", "classic", "dlx", None, 1000, 10, None, "reject-publish", None
    )
    assert snap.queues["rest-q"] == QueueSettings(
        "rest-q", "quorum", "dlx", None, None, None, None, "drop-head", 3
    )
    assert [b.arguments for b in topo.bindings if b.source == "rest"] == [
        (("a", VOID), ("x-match", "any"))
    ]
    assert route(topo, "orders", "order.1.paid") == ("paid",)
    assert route(topo, "orders", "order.1.lost") == ("rest-q",)  # its alternate, a fanout
    assert route(topo, "", "paid") == ("paid",)


def test_rows_round_trip() -> None:
    snap = parse_snapshot(V, 123, EXCHANGES, QUEUES, BINDINGS, POLICIES)
    rows = snapshot_rows(snap)
    assert {r["kind"] for r in rows} == {"exchange", "queue", "binding"}
    assert all(r["vhost"] == V and r["snapshot_ts"] == 123 for r in rows)
    back = snapshots_from_rows(reversed(rows))
    assert list(back) == [(V, 123)]
    again = back[(V, 123)]
    assert dict(again.queues) == dict(snap.queues)
    assert dict(again.topology.exchanges) == dict(snap.topology.exchanges)
    assert set(again.topology.bindings) == set(snap.topology.bindings)
