"""The routing matcher (broker_runtime.rabbit.routing) agrees with a real RabbitMQ node.

Hypothesis builds topologies (direct, fanout, topic and headers exchanges, queue and
exchange-to-exchange bindings, alternate exchanges, the default exchange) and messages; each
topology is declared on the node, read back through the management API (fetch_snapshot),
every message published with confirms, and each queue drained: the queues that got a
message must be those `route` names for it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pika
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from broker_runtime.rabbit.routing import (
    VOID,
    Binding,
    Exchange,
    Topology,
    UnknownExchange,
    headers_match,
    route,
    topic_match,
    topic_words,
)
from broker_runtime.rabbit.topology import fetch_snapshot
from tests.rabbitmq import RabbitNode

pytestmark = pytest.mark.integration

TYPES = ("direct", "fanout", "topic", "headers")
KEY_WORDS = st.sampled_from(["a", "b", "c", ""])
PATTERN_WORDS = st.sampled_from(["a", "b", "*", "#"])
HEADER_NAMES = st.sampled_from(["h1", "h2", "x-h"])
HEADER_VALUES = st.sampled_from(["1", "2", 1, None])
X_MATCH = st.sampled_from([None, "all", "any", "all-with-x", "any-with-x"])


@dataclass(frozen=True)
class Case:
    exchanges: list[tuple[str, int | None]]  # type, alternate exchange (index; may dangle)
    queues: int
    bindings: list[tuple[int, str, int, str, dict[str, Any]]]  # src, kind, dest, key, args
    messages: list[tuple[int | None, str, dict[str, Any]]]  # exchange (None: default), key


def keys(draw: Any, words: Any) -> str:
    return ".".join(draw(st.lists(words, max_size=3)))


@st.composite
def cases(draw: Any) -> Case:
    n_x = draw(st.integers(1, 4))
    n_q = draw(st.integers(1, 3))
    exchanges = [
        (draw(st.sampled_from(TYPES)), draw(st.none() | st.integers(0, n_x))) for _ in range(n_x)
    ]
    bindings = []
    for _ in range(draw(st.integers(0, 8))):
        src = draw(st.integers(0, n_x - 1))
        kind = draw(st.sampled_from(["queue", "queue", "exchange"]))
        dest = draw(st.integers(0, (n_q if kind == "queue" else n_x) - 1))
        key = keys(draw, PATTERN_WORDS if exchanges[src][0] == "topic" else KEY_WORDS)
        args: dict[str, Any] = {}
        if exchanges[src][0] == "headers":
            args = draw(st.dictionaries(HEADER_NAMES, HEADER_VALUES, max_size=3))
            match = draw(X_MATCH)
            if match is not None:
                args["x-match"] = match
        bindings.append((src, kind, dest, key, args))
    # Keys and headers often taken from the bindings, so that routes are found, not only missed.
    bound_keys = [b[3] for b in bindings if "*" not in b[3] and "#" not in b[3]]
    bound_args = [{k: v for k, v in b[4].items() if k != "x-match"} for b in bindings if b[4]]
    messages = []
    for _ in range(draw(st.integers(1, 5))):
        x = draw(st.none() | st.integers(0, n_x - 1))
        if x is None:
            key = draw(st.sampled_from([f"q{i}" for i in range(n_q)]))
        elif bound_keys and draw(st.booleans()):
            key = draw(st.sampled_from(bound_keys))
        else:
            key = keys(draw, KEY_WORDS)
        headers = draw(st.dictionaries(HEADER_NAMES, HEADER_VALUES, max_size=3))
        if bound_args and draw(st.booleans()):
            headers = dict(draw(st.sampled_from(bound_args))) | headers
        if draw(st.integers(0, 5)) == 0:
            headers["CC"] = [keys(draw, KEY_WORDS)]
        messages.append((x, key, headers))
    return Case(exchanges, n_q, bindings, messages)


@pytest.fixture
def channel(rabbit_node: RabbitNode, rabbit_vhost: str) -> Iterator[Any]:
    conn = pika.BlockingConnection(pika.URLParameters(rabbit_node.amqp_url(rabbit_vhost)))
    ch = conn.channel()
    ch.confirm_delivery()
    yield ch
    conn.close()


_run = itertools.count()


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=cases())
@example(  # void binding arguments: "present" under all and any, with and without x-
    case=Case(
        [("headers", None)],
        3,
        [
            (0, "queue", 0, "", {"h1": None}),
            (0, "queue", 1, "", {"x-match": "any", "h2": None, "h1": "2"}),
            (0, "queue", 2, "", {"x-match": "all-with-x", "x-h": None}),
        ],
        [(0, "", {"h1": "1"}), (0, "", {"h2": None}), (0, "", {"x-h": 1}), (0, "", {})],
    )
)
def test_matcher_routes_as_the_broker_does(
    case: Case, channel: Any, rabbit_node: RabbitNode, rabbit_vhost: str
) -> None:
    p = f"r{next(_run)}"
    xname = [f"{p}.x{i}" for i in range(len(case.exchanges))]
    qname = [f"{p}.q{i}" for i in range(case.queues)]
    try:
        for name, (kind, alt) in zip(xname, case.exchanges, strict=True):
            args = {"alternate-exchange": f"{p}.x{alt}"} if alt is not None else None
            channel.exchange_declare(name, kind, arguments=args)
        for q in qname:
            channel.queue_declare(q)
        for src, kind, dest, key, args in case.bindings:
            if kind == "queue":
                channel.queue_bind(qname[dest], xname[src], key, arguments=args)
            else:
                channel.exchange_bind(xname[dest], xname[src], key, arguments=args)
        snapshot = fetch_snapshot(rabbit_node.api_url, rabbit_vhost)
        expected: dict[str, set[str]] = {q: set() for q in qname}
        for i, (x, key, headers) in enumerate(case.messages):
            exchange = "" if x is None else xname[x]
            rk = f"{p}.{key}" if x is None else key
            sent = dict(headers)
            if "CC" in sent:
                sent["CC"] = [f"{p}.{k}" if x is None else k for k in sent["CC"]]
            props = pika.BasicProperties(message_id=str(i), headers=sent or None)
            channel.basic_publish(exchange, rk, b"m", props)
            routed = route(snapshot.topology, exchange, rk, sent)
            for q in routed:
                expected[q].add(str(i))
            kind = "default" if x is None else case.exchanges[x][0]
            event(f"{kind} exchange: {'routed' if routed else 'unrouted'}")
        got: dict[str, set[str]] = {}
        for q in qname:
            got[q] = set()
            while True:
                method, props, _ = channel.basic_get(q, auto_ack=True)
                if method is None:
                    break
                got[q].add(props.message_id)
        assert got == expected, snapshot.topology
    finally:
        for q in qname:
            channel.queue_delete(q)
        for name in xname:
            channel.exchange_delete(name)


# -- the rules on their own, on cases named in RabbitMQ's documentation ----------------------


@pytest.mark.parametrize(
    ("pattern", "key", "hit"),
    [
        ("*.orange.*", "quick.orange.rabbit", True),
        ("*.*.rabbit", "lazy.orange.elephant", False),
        ("lazy.#", "lazy.orange.male.rabbit", True),
        ("lazy.#", "lazy", True),
        ("#", "", True),
        ("*", "", False),
        ("", "", True),
        ("a.*", "a.", True),  # "a." is the words "a" and ""
        ("#.b.#", "b", True),
        ("a.#.b", "a.c.d.b", True),
        ("a.*.b", "a.b", False),
    ],
)
def test_topic_match(pattern: str, key: str, hit: bool) -> None:
    assert topic_match(topic_words(pattern), topic_words(key)) is hit


def test_headers_match_kinds() -> None:
    msg = {"format": "pdf", "type": "report", "x-tenant": "7"}
    assert headers_match([("format", "pdf"), ("type", "report")], msg)
    assert not headers_match([("format", "pdf"), ("type", "log")], msg)
    assert headers_match([("x-match", "any"), ("format", "zip"), ("type", "report")], msg)
    assert not headers_match([("x-match", "any")], msg)  # nothing to match
    assert headers_match([("x-match", "all")], {})  # nothing required
    assert headers_match([("x-match", "all"), ("x-tenant", "8")], msg)  # x- skipped
    assert not headers_match([("x-match", "all-with-x"), ("x-tenant", "8")], msg)
    assert headers_match([("x-match", "any-with-x"), ("x-tenant", "7"), ("a", 1)], msg)
    assert headers_match([("type", VOID)], msg) and not headers_match([("size", None)], msg)
    assert not headers_match([("n", 1)], {"n": True}) and headers_match([("n", 1)], {"n": 1.0})


def test_alternate_exchange_loops_and_unknown_exchange() -> None:
    topo = Topology(
        {
            "in": Exchange("in", "direct", alternate="ae"),
            "ae": Exchange("ae", "fanout", alternate="in"),
            "hop": Exchange("hop", "topic"),
        },
        frozenset({"paid", "other", "audit"}),
        (
            Binding("in", "paid", "queue", "paid"),
            Binding("in", "hop", "exchange", "paid"),
            Binding("hop", "in", "exchange", "#"),  # a cycle: each exchange routes once
            Binding("hop", "audit", "queue", "#"),
            Binding("ae", "other", "queue"),
        ),
    )
    assert route(topo, "in", "paid") == ("audit", "paid")
    assert route(topo, "in", "shipped") == ("other",)  # by the alternate exchange
    assert route(topo, "", "paid") == ("paid",) and route(topo, "", "nope") == ()
    with pytest.raises(UnknownExchange):
        route(topo, "missing", "k")
