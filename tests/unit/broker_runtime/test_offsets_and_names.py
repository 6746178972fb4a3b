"""ConsumerOffsets' JSON file (RocketMQ's consumerOffset.json) and the topic/group name rules."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from broker_runtime.common import topics
from broker_runtime.common.topics import (
    InvalidNameError,
    dlq_topic,
    group_of,
    is_dlq_topic,
    is_retry_topic,
    retry_topic,
    validate_group,
    validate_topic,
)
from broker_runtime.offsets.consumer_offsets import ConsumerOffsets
from broker_runtime.offsets.json_file import CorruptStateError, read_with_backup, write_atomic


def offsets_file(root: Path) -> Path:
    return root / "config" / "consumerOffset.json"


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "config").iterdir() if p.name.endswith(".tmp"))


# -- ConsumerOffsets ----------------------------------------------------------------------------


def test_commit_query_and_file_shape(tmp_path: Path) -> None:
    co = ConsumerOffsets(tmp_path)
    assert co.query("topic", "group", 0) == -1  # never committed
    co.commit("topic", "group", 0, 33)
    assert co.query("topic", "group", 0) == 33
    assert co.query("topic", "group", 1) == -1
    assert co.query("topic", "other", 0) == -1
    assert not offsets_file(tmp_path).exists()  # nothing is written before persist()
    co.persist()
    assert json.loads(offsets_file(tmp_path).read_text()) == {
        "offsetTable": {"topic@group": {"0": 33}}
    }
    assert leftovers(tmp_path) == []


def test_persist_and_reload(tmp_path: Path) -> None:
    co = ConsumerOffsets(tmp_path)
    co.commit("TopicA", "g1", 0, 10)
    co.commit("TopicA", "g1", 3, 7)
    co.commit("TopicA", "g1", 0, 12)  # a later commit replaces the earlier one
    co.commit("%RETRY%g1", "g1", 0, 0)
    co.commit("TopicB", "g2", 11, 2**40)
    co.persist()
    data = json.loads(offsets_file(tmp_path).read_text())
    assert data == {
        "offsetTable": {
            "TopicA@g1": {"0": 12, "3": 7},
            "%RETRY%g1@g1": {"0": 0},
            "TopicB@g2": {"11": 2**40},
        }
    }
    again = ConsumerOffsets(tmp_path)
    assert again.table() == {
        "TopicA@g1": {0: 12, 3: 7},
        "%RETRY%g1@g1": {0: 0},
        "TopicB@g2": {11: 2**40},
    }
    assert again.query("TopicA", "g1", 3) == 7
    assert again.query("TopicB", "g2", 11) == 2**40
    # A table returned is a copy.
    t = again.table()
    t["TopicA@g1"][0] = 999
    assert again.query("TopicA", "g1", 0) == 12


def test_concurrent_persists_all_succeed(tmp_path: Path) -> None:
    """The periodic persist and a slave's sync run on executor threads at once."""
    offsets = ConsumerOffsets(tmp_path)
    offsets.commit("t", "g", 0, 7)
    with ThreadPoolExecutor(4) as pool:
        for f in [pool.submit(offsets.persist) for _ in range(200)]:
            f.result()  # a shared tmp file renamed by another writer would raise here
    assert ConsumerOffsets(tmp_path).query("t", "g", 0) == 7
    assert leftovers(tmp_path) == []


def test_reload_of_an_empty_store(tmp_path: Path) -> None:
    assert ConsumerOffsets(tmp_path).table() == {}
    ConsumerOffsets(tmp_path).persist()
    assert json.loads(offsets_file(tmp_path).read_text()) == {"offsetTable": {}}
    assert ConsumerOffsets(tmp_path).table() == {}


def test_second_persist_leaves_a_bak_with_the_previous_content(tmp_path: Path) -> None:
    co = ConsumerOffsets(tmp_path)
    co.commit("T", "g", 0, 1)
    co.persist()
    first = offsets_file(tmp_path).read_bytes()
    bak = offsets_file(tmp_path).with_name("consumerOffset.json.bak")
    assert not bak.exists()
    co.commit("T", "g", 0, 2)
    co.persist()
    assert bak.read_bytes() == first
    assert json.loads(bak.read_text()) == {"offsetTable": {"T@g": {"0": 1}}}
    assert json.loads(offsets_file(tmp_path).read_text()) == {"offsetTable": {"T@g": {"0": 2}}}
    co.commit("T", "g", 1, 5)
    co.persist()
    assert json.loads(bak.read_text()) == {"offsetTable": {"T@g": {"0": 2}}}
    assert leftovers(tmp_path) == []
    assert sorted(os.listdir(tmp_path / "config")) == [
        "consumerOffset.json",
        "consumerOffset.json.bak",
    ]


@pytest.mark.parametrize(
    "damage", [b"", b'{"offsetTable": {"T@g": {"0"', b"\x00" * 64, b"not json"]
)
def test_corrupted_main_file_falls_back_to_bak(tmp_path: Path, damage: bytes) -> None:
    co = ConsumerOffsets(tmp_path)
    co.commit("T", "g", 0, 1)
    co.persist()
    co.commit("T", "g", 0, 2)
    co.persist()
    offsets_file(tmp_path).write_bytes(damage)  # e.g. a torn write
    assert ConsumerOffsets(tmp_path).query("T", "g", 0) == 1  # the previous version


def test_missing_main_file_falls_back_to_bak(tmp_path: Path) -> None:
    co = ConsumerOffsets(tmp_path)
    co.commit("T", "g", 0, 1)
    co.persist()
    co.commit("T", "g", 0, 2)
    co.persist()
    offsets_file(tmp_path).unlink()  # a crash between the two renames
    assert ConsumerOffsets(tmp_path).query("T", "g", 0) == 1


def test_both_files_corrupt_is_an_error(tmp_path: Path) -> None:
    path = offsets_file(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text("{")
    with pytest.raises(CorruptStateError):
        ConsumerOffsets(tmp_path)
    path.with_name(path.name + ".bak").write_text("[")
    with pytest.raises(CorruptStateError):
        ConsumerOffsets(tmp_path)


@pytest.mark.parametrize(
    "doc",
    [
        {"table": {}},
        {"offsetTable": [1, 2]},
        {"offsetTable": {"T@g": {"zero": 1}}},
        {"offsetTable": {"T@g": [1]}},
        [],
    ],
)
def test_valid_json_of_the_wrong_shape_is_an_error(tmp_path: Path, doc: object) -> None:
    path = offsets_file(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(doc))
    with pytest.raises(CorruptStateError):
        ConsumerOffsets(tmp_path)


def test_commit_validates_names_and_numbers(tmp_path: Path) -> None:
    co = ConsumerOffsets(tmp_path)
    with pytest.raises(InvalidNameError):
        co.commit("bad topic", "g", 0, 1)
    with pytest.raises(InvalidNameError):
        co.commit("T", "g@x", 0, 1)  # '@' would make the key ambiguous
    with pytest.raises(InvalidNameError):
        co.commit("T@x", "g", 0, 1)
    with pytest.raises(ValueError):
        co.commit("T", "g", 0, -1)
    with pytest.raises(ValueError):
        co.commit("T", "g", -1, 0)
    assert co.table() == {}
    assert ConsumerOffsets.key("T", "g") == "T@g"


def test_write_atomic_and_read_with_backup(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "state.json"
    assert read_with_backup(path) is None
    write_atomic(path, {"a": 1})
    assert read_with_backup(path) == {"a": 1}
    assert not path.with_name("state.json.bak").exists()
    write_atomic(path, {"a": 2})
    assert read_with_backup(path) == {"a": 2}
    assert json.loads(path.with_name("state.json.bak").read_text()) == {"a": 1}
    assert not path.with_name("state.json.tmp").exists()
    # A stale .tmp from a crash mid-write is simply replaced.
    path.with_name("state.json.tmp").write_text("garbage")
    write_atomic(path, {"a": 3})
    assert not path.with_name("state.json.tmp").exists()
    assert read_with_backup(path) == {"a": 3}


# -- names --------------------------------------------------------------------------------------


def test_retry_and_dlq_topics() -> None:
    assert retry_topic("g") == "%RETRY%g"
    assert dlq_topic("g") == "%DLQ%g"
    assert topics.RETRY_PREFIX == "%RETRY%" and topics.DLQ_PREFIX == "%DLQ%"
    assert is_retry_topic("%RETRY%g") and not is_retry_topic("%DLQ%g")
    assert is_dlq_topic("%DLQ%g") and not is_dlq_topic("T")
    assert group_of("%RETRY%g") == "g"
    assert group_of("%DLQ%consumer-1") == "consumer-1"
    assert group_of(retry_topic("a_b-c")) == "a_b-c"
    assert group_of("T") is None
    assert group_of("RETRY%g") is None
    assert group_of("x%RETRY%g") is None
    assert group_of(topics.SCHEDULE_TOPIC) is None
    validate_topic(retry_topic("g"))
    validate_topic(dlq_topic("g"))


@pytest.mark.parametrize(
    "name",
    ["a", "T", "a" * 127, "%RETRY%g", "%DLQ%g", "Topic_1-x", "a|b", "SCHEDULE_TOPIC_XXXX", "0"],
)
def test_valid_names(name: str) -> None:
    assert validate_topic(name) == name
    assert validate_group(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "a" * 128,
        "a" * 1000,
        "../x",
        "..",
        ".",
        "a/b",
        "a\\b",
        "a b",
        " a",
        "x\n",
        "\nx",
        "t\u00f3pico",
        "\u0442\u043e\u043f\u0438\u043a",
        "\uff21",  # fullwidth A
        "a\x00",
        "a@b",
        "a#b",
        "a.b",
        "a:b",
        "\u0660",  # Arabic-Indic digit zero: not [0-9]
    ],
)
def test_invalid_names(name: str) -> None:
    with pytest.raises(InvalidNameError):
        validate_topic(name)
    with pytest.raises(InvalidNameError):
        validate_group(name)


@pytest.mark.parametrize("value", [None, 1, b"topic", ["t"]])
def test_non_strings_are_invalid(value: object) -> None:
    with pytest.raises(InvalidNameError):
        validate_topic(value)


def test_length_limit_message() -> None:
    assert len(validate_topic("a" * 127)) == 127
    with pytest.raises(InvalidNameError, match="128"):
        validate_topic("a" * 128)
    with pytest.raises(InvalidNameError, match="empty"):
        validate_topic("")
