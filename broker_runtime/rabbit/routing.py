"""Which queues a publish reaches: RabbitMQ's routing as a pure function over a topology.

It follows the broker's own code (rabbit_exchange:route/2 and the exchange type modules of
RabbitMQ 3.10): the default exchange delivers to the queue named by the routing key; direct
compares keys, fanout takes every binding, topic matches `.`-separated words (`*` exactly
one word, `#` zero or more; the empty key has no words), headers compares the binding's
arguments with the message's headers (`x-match` all / any / all-with-x / any-with-x; `x-`
arguments are skipped except by the `-with-x` kinds; a void argument asks only that the
header be present). A binding to an exchange routes the message on through that exchange
with the same keys, each exchange at most once; an exchange whose own bindings give no
destination passes the message to its alternate exchange. `CC` and `BCC` headers add
routing keys (sender-selected distribution).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

DestinationType = Literal["queue", "exchange"]
EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers")
X_MATCH_KINDS = ("all", "any", "all-with-x", "any-with-x")


class Void:
    """A header or binding argument without a value (AMQP's void field type)."""

    def __repr__(self) -> str:
        return "VOID"


VOID = Void()


@dataclass(frozen=True)
class Exchange:
    name: str
    type: str  # direct, fanout, topic or headers
    alternate: str | None = None  # its alternate exchange (argument or policy)


@dataclass(frozen=True)
class Binding:
    source: str
    destination: str
    destination_type: DestinationType
    routing_key: str = ""
    arguments: tuple[tuple[str, Any], ...] = ()  # (name, value) pairs; VOID for no value


@dataclass(frozen=True)
class Topology:
    """A virtual host's exchanges, queues and bindings (the default exchange is implicit)."""

    exchanges: Mapping[str, Exchange]
    queues: frozenset[str]
    bindings: tuple[Binding, ...]
    _by_source: dict[str, list[Binding]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_source: dict[str, list[Binding]] = {}
        for b in self.bindings:
            by_source.setdefault(b.source, []).append(b)
        object.__setattr__(self, "_by_source", by_source)

    def bindings_of(self, exchange: str) -> list[Binding]:
        return self._by_source.get(exchange, [])


class UnknownExchange(LookupError):
    """A publish to an exchange the topology does not have (the broker closes the channel)."""


def route(
    topology: Topology,
    exchange: str,
    routing_key: str,
    headers: Mapping[str, Any] | None = None,
) -> tuple[str, ...]:
    """The queues a message published to `exchange` with these keys and headers reaches,
    sorted (each once, as the broker stores one copy per queue)."""
    headers = headers or {}
    keys = [routing_key, *_header_routes(headers, "CC"), *_header_routes(headers, "BCC")]
    if exchange == "":
        return tuple(sorted({k for k in keys if k in topology.queues}))
    start = topology.exchanges.get(exchange)
    if start is None:
        raise UnknownExchange(exchange)
    queues: set[str] = set()
    seen = {exchange}
    work = [start]
    while work:
        x = work.pop()
        dests = _match(topology, x, keys, headers)
        if not dests and x.alternate is not None:
            dests = [(x.alternate, "exchange")]
        for name, kind in dests:
            if kind == "queue":
                queues.add(name)
            elif name not in seen and name in topology.exchanges:
                seen.add(name)
                work.append(topology.exchanges[name])
    return tuple(sorted(queues))


def _match(
    topology: Topology, x: Exchange, keys: list[str], headers: Mapping[str, Any]
) -> list[tuple[str, DestinationType]]:
    bindings = topology.bindings_of(x.name)
    if x.type == "fanout":
        hits = bindings
    elif x.type == "direct":
        wanted = set(keys)
        hits = [b for b in bindings if b.routing_key in wanted]
    elif x.type == "topic":
        words = [topic_words(k) for k in keys]
        hits = [
            b for b in bindings if any(topic_match(topic_words(b.routing_key), w) for w in words)
        ]
    elif x.type == "headers":
        hits = [b for b in bindings if headers_match(b.arguments, headers)]
    else:
        raise ValueError(f"exchange {x.name!r} has a type this matcher does not know: {x.type!r}")
    return [(b.destination, b.destination_type) for b in hits]


def _header_routes(headers: Mapping[str, Any], name: str) -> list[str]:
    value = headers.get(name)
    if not isinstance(value, list | tuple):
        return []
    return [v.decode() if isinstance(v, bytes) else v for v in value if isinstance(v, str | bytes)]


def topic_words(key: str) -> list[str]:
    """A topic key's words: split on `.`, the empty key having none."""
    return key.split(".") if key else []


def topic_match(pattern: list[str], words: list[str]) -> bool:
    """Whether binding words `pattern` (`*` one word, `#` zero or more) match `words`."""
    # can[j]: the pattern so far can end having consumed words[:j].
    can = [True] + [False] * len(words)
    for p in pattern:
        if p == "#":
            nxt, reach = [], False
            for c in can:
                reach = reach or c
                nxt.append(reach)
        else:
            nxt = [False] + [can[j] and (p == "*" or p == words[j]) for j in range(len(words))]
        can = nxt
    return can[-1]


def headers_match(arguments: Iterable[tuple[str, Any]], headers: Mapping[str, Any]) -> bool:
    """A headers-exchange binding's verdict on a message's headers."""
    args = dict(arguments)
    kind = args.get("x-match", "all")
    kind = kind if kind in X_MATCH_KINDS else "all"  # the broker treats others as all
    with_x = kind.endswith("-with-x")
    considered = [
        (k, v) for k, v in args.items() if k != "x-match" and (with_x or not k.startswith("x-"))
    ]
    hits = [k in headers and (_void(v) or _same(v, headers[k])) for k, v in considered]
    return all(hits) if kind.startswith("all") else any(hits)


def _void(value: Any) -> bool:
    """No value: VOID, or None as pika and the management API's JSON give it."""
    return value is None or isinstance(value, Void)


def _same(a: Any, b: Any) -> bool:
    """Erlang's `==` on AMQP field values: numbers by value, booleans only with booleans."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, bytes):
        a = a.decode("utf-8", "surrogateescape")
    if isinstance(b, bytes):
        b = b.decode("utf-8", "surrogateescape")
    if _void(b):
        return False
    return bool(a == b)
