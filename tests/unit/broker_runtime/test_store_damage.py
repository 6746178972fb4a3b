"""`mqaudit store verify` and `store dump` on damaged stores: every damaged range reported
with file, offset, length and reason, and the scan goes on past it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from broker_runtime.store.mapped_file import segment_name
from tests.unit.broker_runtime.test_store_cli import (
    MESSAGES,
    SEGMENT,
    json_lines,
    mqaudit,
    new_store,
    one_json_line,
)
from tests.unit.pipeline.stores import stored


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return new_store(tmp_path / "store")


def _patch(store: Path, offset: int, data: bytes) -> None:
    path = store / "commitlog" / segment_name(offset // SEGMENT * SEGMENT)
    with path.open("r+b") as f:
        f.seek(offset % SEGMENT)
        f.write(data)


def test_verify_reports_a_damaged_unit_and_goes_on_past_it(store: Path) -> None:
    msgs = stored(store)
    victim = msgs[5]
    _patch(store, victim.phys_offset + 4, b"\0\0\0\1")  # its magic
    proc = mqaudit("store", "verify", "--store", store)
    assert proc.returncode == 1, proc.stderr
    report = one_json_line(proc)
    assert report["messages"] == MESSAGES - 1
    assert report["torn_tail_bytes"] == 0
    assert (report["damaged_ranges"], report["damaged_bytes"]) == (1, victim.total_size)
    [p] = [p for p in report["problems"] if p["file"] is not None]
    assert (p["kind"], p["file"], p["position"], p["log_offset"], p["length"]) == (
        "bad_magic", segment_name(0), victim.phys_offset, victim.phys_offset, victim.total_size,
    )  # fmt: skip
    # Its ConsumeQueue entry points at the damaged bytes; every other entry matches.
    assert report["consume_queue_mismatches"] == 1
    assert report["consume_queue_missing"] == 0


def test_verify_and_dump_read_properties_that_are_not_utf8(store: Path) -> None:
    msgs = stored(store)
    victim = msgs[7]
    raw = (store / "commitlog" / segment_name(0)).read_bytes()
    unit = raw[victim.phys_offset : victim.phys_offset + victim.total_size]
    at = unit.rindex(b"UNIQ_KEY\x01") + 9  # not its TAGS: their hash is in the queue
    _patch(store, victim.phys_offset + at, b"\xd2")
    proc = mqaudit("store", "verify", "--store", store)
    assert proc.returncode == 1, proc.stderr
    report = one_json_line(proc)
    assert (report["messages"], report["bad_texts"], report["damaged_ranges"]) == (MESSAGES, 1, 0)
    [p] = report["problems"]
    assert (p["kind"], p["log_offset"], p["length"]) == (
        "bad_text", victim.phys_offset, victim.total_size,
    )  # fmt: skip
    assert report["consume_queue_mismatches"] == report["consume_queue_missing"] == 0

    dump = mqaudit("store", "dump", "--store", store)
    assert dump.returncode == 0, dump.stderr
    records = json_lines(dump)
    assert len(records) == MESSAGES
    assert [r["phys_offset"] for r in records if not r["text_ok"]] == [victim.phys_offset]


def test_a_segment_cut_short_is_reported_to_the_next_segment(store: Path) -> None:
    msgs = stored(store)
    first = store / "commitlog" / segment_name(0)
    cut = SEGMENT // 2 + 11
    [victim] = [m for m in msgs if m.phys_offset < cut < m.phys_offset + m.total_size]
    os.truncate(first, cut)
    proc = mqaudit("store", "verify", "--store", store)
    assert proc.returncode == 1, proc.stderr
    report = one_json_line(proc)
    lost = [m for m in msgs if victim.phys_offset <= m.phys_offset < SEGMENT]
    assert report["messages"] == MESSAGES - len(lost)
    got = [
        (p["kind"], p["file"], p["log_offset"], p["length"])
        for p in report["problems"]
        if p["file"] is not None
    ]
    assert got == [
        ("torn", segment_name(0), victim.phys_offset, cut - victim.phys_offset),
        ("segment_gap", segment_name(0), cut, SEGMENT - cut),
    ]
    assert report["segment_size"] == SEGMENT

    dump = mqaudit("store", "dump", "--store", store)
    assert dump.returncode == 1
    assert len(json_lines(dump)) == MESSAGES - len(lost)
    skipped = [json.loads(line)["skipped"] for line in dump.stderr.splitlines()]
    assert [(s["kind"], s["log_offset"]) for s in skipped] == [
        ("torn", victim.phys_offset),
        ("segment_gap", cut),
    ]


def test_dump_prints_the_good_messages_around_damage(store: Path) -> None:
    msgs = stored(store)
    victims = [msgs[3], msgs[len(msgs) // 2]]
    for v in victims:
        _patch(store, v.phys_offset, b"\xff" * 40)
    dump = mqaudit("store", "dump", "--store", store)
    assert dump.returncode == 1
    want = [m.phys_offset for m in msgs if m not in victims]
    assert [r["phys_offset"] for r in json_lines(dump)] == want
    skipped = [json.loads(line)["skipped"] for line in dump.stderr.splitlines()]
    assert [(s["log_offset"], s["length"]) for s in skipped] == [
        (v.phys_offset, v.total_size) for v in victims
    ]


def test_the_last_segment_shorter_than_the_others_is_reported(store: Path) -> None:
    files = sorted((store / "commitlog").iterdir())
    last = files[-1]
    data_end = len(last.read_bytes().rstrip(b"\0"))
    os.truncate(last, data_end + 100)
    report = one_json_line(mqaudit("store", "verify", "--store", store))
    assert report["messages"] == MESSAGES
    [p] = report["problems"]
    assert (p["kind"], p["log_offset"], p["length"]) == (
        "segment_size", int(last.name) + data_end + 100, SEGMENT - data_end - 100,
    )  # fmt: skip
