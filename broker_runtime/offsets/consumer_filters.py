"""`STORE/config/consumerFilter.json`: the SQL92 subscriptions a broker has seen, kept as
Apache RocketMQ 4.9's ConsumerFilterManager keeps them.

Layout (fastjson, keys sorted; `dead` is fastjson's rendering of `isDead()`):

    {"filterDataByTopic": {TOPIC: {"groupFilterData": {GROUP: {
        "bloomFilterData": {"bitNum": 112, "bitPos": [..3 ints..]},
        "bornTime": ms, "clientVersion": subVersion, "consumerGroup": GROUP, "dead": false,
        "deadTime": 0, "expression": "a > 1", "expressionType": "SQL92", "topic": TOPIC}},
        "topic": TOPIC}}}

As RocketMQ's: only SQL92 subscriptions are kept (a tag subscription returns early in
`register`); every heartbeat registers its group's subscriptions (a newer client version
with another expression replaces the entry, with a new `bornTime`); a group whose last
client left gets a `deadTime`; a topic the group no longer subscribes to dies too; entries
dead for a day are dropped when the file is written; on load every live entry is taken as
dead 30 s ago (its consumers reconnect and revive it). The Bloom filter bits are RocketMQ's
(`BloomFilter.createByFn(20, 32)`: murmur3_128 of `group#topic`, by the mmh3 package, the
C MurmurHash3 that Guava's `Hashing.murmur3_128` implements), so that a real broker loading
this file keeps it rather than discarding it as "Bloom filter is changed".
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mmh3

from broker_runtime.common.constants import SQL92
from broker_runtime.common.sql_filter import SqlFilterError, compile_sql
from broker_runtime.offsets.json_file import CorruptStateError, read_with_backup, write_atomic

CONSUMER_FILTER_FILE = Path("config") / "consumerFilter.json"
DEAD_AT_LOAD_MS = 30_000  # ConsumerFilterManager.decode: "we think all consumers are dead"
CLEAN_AFTER_MS = 24 * 3600 * 1000  # BrokerConfig.filterDataCleanTimeSpan
BLOOM_ERROR_PERCENT = 20  # BrokerConfig.maxErrorRateOfBloomFilter
BLOOM_EXPECTED_CONSUMERS = 32  # BrokerConfig.expectConsumerNumUseFilter


def consumer_filter_path(store_dir: Path | str) -> Path:
    return Path(store_dir) / CONSUMER_FILTER_FILE


def _bloom_shape(
    f: int = BLOOM_ERROR_PERCENT, n: int = BLOOM_EXPECTED_CONSUMERS
) -> tuple[int, int]:
    """BloomFilter's (k hash functions, m bits) for an error rate of f% over n members."""
    rate = f / 100.0
    k = math.ceil(math.log(rate) / math.log(0.5))
    m = math.ceil(n * (math.log(1 / rate) / math.log(2)) * (math.log(math.e) / math.log(2)))
    return k, 8 * math.ceil(m / 8.0)


K_HASHES, BIT_NUM = _bloom_shape()


def _int32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


def bloom_bit_positions(text: str) -> list[int]:
    """BloomFilter.calcBitPositions: Java int arithmetic over murmur3_128's first long."""
    h64 = mmh3.hash64(text.encode(), 0, True, False)[0]
    h1, h2 = _int32(h64), _int32(h64 >> 32)
    out = []
    for i in range(1, K_HASHES + 1):
        combined = _int32(h1 + i * h2)
        if combined < 0:
            combined = ~combined
        out.append(combined % BIT_NUM)
    return out


@dataclass(slots=True)
class FilterData:
    """One ConsumerFilterData: a group's SQL92 expression on one topic."""

    topic: str
    consumer_group: str
    expression: str
    expression_type: str
    born_time: int
    client_version: int
    dead_time: int = 0

    @property
    def dead(self) -> bool:
        return self.dead_time >= self.born_time

    def to_json(self) -> dict[str, Any]:
        return {
            "bloomFilterData": {
                "bitNum": BIT_NUM,
                "bitPos": bloom_bit_positions(f"{self.consumer_group}#{self.topic}"),
            },
            "bornTime": self.born_time,
            "clientVersion": self.client_version,
            "consumerGroup": self.consumer_group,
            "dead": self.dead,
            "deadTime": self.dead_time,
            "expression": self.expression,
            "expressionType": self.expression_type,
            "topic": self.topic,
        }

    @classmethod
    def from_json(cls, topic: str, group: str, d: dict[str, Any]) -> FilterData:
        return cls(
            str(d.get("topic") or topic),
            str(d.get("consumerGroup") or group),
            str(d["expression"]),
            str(d["expressionType"]),
            int(d.get("bornTime", 0)),
            int(d.get("clientVersion", 0)),
            int(d.get("deadTime", 0)),
        )


def _compiles(expression: str) -> bool:
    try:
        compile_sql(expression)
    except SqlFilterError:
        return False
    return True


def read_consumer_filters(store_dir: Path | str) -> list[FilterData]:
    """The entries of consumerFilter.json (or its .bak) as written, dead ones included;
    [] without the file; CorruptStateError when it is not a filterDataByTopic table."""
    path = consumer_filter_path(store_dir)
    data = read_with_backup(path)
    if data is None:
        return []
    try:
        return [
            FilterData.from_json(topic, group, entry)
            for topic, by_topic in (data.get("filterDataByTopic") or {}).items()
            if by_topic
            for group, entry in (by_topic.get("groupFilterData") or {}).items()
            if entry
        ]
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CorruptStateError(f"{path} is not a filterDataByTopic table: {e!r}") from e


def encode_filters(entries: Iterable[FilterData]) -> dict[str, Any]:
    by_topic: dict[str, Any] = {}
    for e in sorted(entries, key=lambda e: (e.topic, e.consumer_group)):
        t = by_topic.setdefault(e.topic, {"groupFilterData": {}, "topic": e.topic})
        t["groupFilterData"][e.consumer_group] = e.to_json()
    return {"filterDataByTopic": by_topic}


class ConsumerFilterManager:
    """The broker's table of SQL92 subscriptions; `persist` writes it atomically with a
    `.bak`. Heartbeats call `register` on the event loop, `persist` runs in a thread."""

    def __init__(self, store_dir: Path | str, now_ms: int) -> None:
        self.path = consumer_filter_path(store_dir)
        self._lock = threading.Lock()
        self._table: dict[tuple[str, str], FilterData] = {}
        for e in read_consumer_filters(store_dir):
            if e.dead_time == 0:
                e.dead_time = max(now_ms - DEAD_AT_LOAD_MS, e.born_time)
            self._table[(e.topic, e.consumer_group)] = e

    def entries(self) -> list[FilterData]:
        with self._lock:
            return sorted(self._table.values(), key=lambda e: (e.topic, e.consumer_group))

    def register_group(
        self, group: str, subscriptions: Iterable[tuple[str, str, str, int]], now_ms: int
    ) -> None:
        """A heartbeat's subscriptions (topic, expression, type, client version); the group's
        other topics die."""
        subs = list(subscriptions)
        with self._lock:
            for topic, expression, kind, version in subs:
                self._register(topic, group, expression, kind, version, now_ms)
            topics = {s[0] for s in subs}
            for e in self._table.values():
                if e.consumer_group == group and e.topic not in topics and not e.dead:
                    e.dead_time = now_ms

    def _register(
        self, topic: str, group: str, expression: str, kind: str, version: int, now_ms: int
    ) -> None:
        if kind != SQL92 or not expression:
            return
        old = self._table.get((topic, group))
        if old is not None and version <= old.client_version:
            if version == old.client_version and old.dead:
                old.dead_time = 0  # reAlive
            return
        if old is not None and (old.expression, old.expression_type) == (expression, kind):
            old.client_version = version
            if old.dead:
                old.dead_time = 0
            return
        if not _compiles(expression):
            self._table.pop((topic, group), None)  # the client is told at its pulls
            return
        self._table[(topic, group)] = FilterData(topic, group, expression, kind, now_ms, version)

    def unregister(self, group: str, now_ms: int) -> None:
        """The group's last client left."""
        with self._lock:
            for e in self._table.values():
                if e.consumer_group == group and not e.dead:
                    e.dead_time = now_ms

    def persist(self, now_ms: int) -> None:
        """Drop entries dead for CLEAN_AFTER_MS, then write the file (ConfigManager.persist)."""
        with self._lock:
            for key, e in list(self._table.items()):
                if e.dead and now_ms - e.dead_time >= CLEAN_AFTER_MS:
                    del self._table[key]
            data = encode_filters(self._table.values())
        write_atomic(self.path, data)
