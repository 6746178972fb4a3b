"""consumerFilter.json as Apache RocketMQ 4.9's ConsumerFilterManager keeps it: SQL92 only,
replaced by a newer client version, dead when the group leaves or drops the topic, dead at
load, cleaned after a day, written atomically with a `.bak`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker_runtime.offsets.consumer_filters import (
    BIT_NUM,
    CLEAN_AFTER_MS,
    DEAD_AT_LOAD_MS,
    K_HASHES,
    ConsumerFilterManager,
    bloom_bit_positions,
    consumer_filter_path,
    read_consumer_filters,
)
from broker_runtime.offsets.json_file import CorruptStateError

SQL = "color = 'red' AND n > 3"


def test_the_bloom_filter_is_rocketmqs() -> None:
    """BloomFilter.createByFn(20, 32) and its bits, as printed by RocketMQ 4.9.7's own class
    (tests/interop's classpath, `BloomFilter.generate(s).getBitPos()`)."""
    assert (K_HASHES, BIT_NUM) == (3, 112)
    assert bloom_bit_positions("g_sql#TopicA") == [54, 96, 8]
    assert bloom_bit_positions("j_sql_or#SqlInterop") == [47, 85, 11]
    assert bloom_bit_positions("grüne#Tö") == [21, 107, 30]


def test_only_sql92_subscriptions_are_kept_in_rocketmqs_layout(tmp_path: Path) -> None:
    m = ConsumerFilterManager(tmp_path, now_ms=1_000)
    subs = [("T", SQL, "SQL92", 7), ("U", "A || B", "TAG", 7), ("%RETRY%g", "*", "TAG", 7)]
    m.register_group("g", subs, 2_000)
    m.register_group("h", [("T", "a IS NULL", "SQL92", 9)], 2_500)
    m.persist(3_000)
    data = json.loads(consumer_filter_path(tmp_path).read_text())
    assert list(data) == ["filterDataByTopic"] and list(data["filterDataByTopic"]) == ["T"]
    by_group = data["filterDataByTopic"]["T"]
    assert by_group["topic"] == "T" and sorted(by_group["groupFilterData"]) == ["g", "h"]
    assert by_group["groupFilterData"]["g"] == {
        "bloomFilterData": {"bitNum": 112, "bitPos": bloom_bit_positions("g#T")},
        "bornTime": 2_000,
        "clientVersion": 7,
        "consumerGroup": "g",
        "dead": False,
        "deadTime": 0,
        "expression": SQL,
        "expressionType": "SQL92",
        "topic": "T",
    }


def test_versions_deaths_and_reloads_follow_rocketmq(tmp_path: Path) -> None:
    m = ConsumerFilterManager(tmp_path, now_ms=0)
    m.register_group("g", [("T", SQL, "SQL92", 5)], 1_000)
    m.register_group("g", [("T", "n > 100", "SQL92", 4)], 1_100)  # older client: ignored
    (e,) = m.entries()
    assert (e.expression, e.born_time) == (SQL, 1_000)
    m.register_group("g", [("T", "n > 100", "SQL92", 6)], 1_200)  # newer: replaces, new birth
    (e,) = m.entries()
    assert (e.expression, e.born_time, e.client_version) == ("n > 100", 1_200, 6)
    m.register_group("g", [("T", "n >", "SQL92", 8)], 1_300)  # does not compile: removed
    assert m.entries() == []
    m.register_group("g", [("T", SQL, "SQL92", 9), ("V", "b = 1", "SQL92", 9)], 1_400)
    m.register_group("g", [("T", SQL, "SQL92", 9)], 1_500)  # V dropped: it dies
    assert {(e.topic, e.dead_time) for e in m.entries()} == {("T", 0), ("V", 1_500)}
    m.unregister("g", 1_600)
    assert {(e.topic, e.dead) for e in m.entries()} == {("T", True), ("V", True)}
    m.register_group("g", [("T", SQL, "SQL92", 9)], 1_700)  # same version: revived
    assert {(e.topic, e.dead) for e in m.entries()} == {("T", False), ("V", True)}
    m.persist(1_800)
    m.persist(1_500 + CLEAN_AFTER_MS)  # V dead for a day: dropped
    assert [e.topic for e in read_consumer_filters(tmp_path)] == ["T"]
    assert consumer_filter_path(tmp_path).with_suffix(".json.bak").exists()
    now = 1_700 + 10 * DEAD_AT_LOAD_MS
    (loaded,) = ConsumerFilterManager(tmp_path, now_ms=now).entries()
    assert (loaded.dead, loaded.dead_time) == (True, now - DEAD_AT_LOAD_MS)


def test_a_damaged_file_falls_back_to_its_bak_then_says_what_is_wrong(tmp_path: Path) -> None:
    m = ConsumerFilterManager(tmp_path, now_ms=0)
    m.register_group("g", [("T", SQL, "SQL92", 1)], 10)
    m.persist(20)
    m.persist(30)
    path = consumer_filter_path(tmp_path)
    path.write_text("{not json")
    assert [e.consumer_group for e in read_consumer_filters(tmp_path)] == ["g"]
    path.with_name(path.name + ".bak").write_text('{"filterDataByTopic": {"T": 3}}')
    path.write_text('{"filterDataByTopic": {"T": {"groupFilterData": {"g": {"x": 1}}}}}')
    with pytest.raises(CorruptStateError, match="not a filterDataByTopic table"):
        read_consumer_filters(tmp_path)
