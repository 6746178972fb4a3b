"""Every byte of the log is a message or a quarantined range, also across damaged segments."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.readers.commitlog import segment_files
from tests.unit.pipeline.stores import SEG, stored, varied, write_store
from tests.unit.pipeline.test_segments import bad_of, read_all


@pytest.mark.parametrize("how", ["truncated", "zeroed"])
def test_a_segment_cut_short_is_accounted_for_to_the_next_segment(tmp_path: Path, how: str) -> None:
    store = tmp_path / "store"
    write_store(store, varied(400))
    files = segment_files(store)
    assert len(files) >= 3
    msgs = stored(store)
    cut = SEG // 2 + 123  # inside a unit of the first segment
    [victim] = [m for m in msgs if m.phys_offset < cut < m.phys_offset + m.total_size]
    if how == "truncated":
        os.truncate(files[0], cut)
    else:  # zeros from the victim's MAGICCODE to the segment's end
        with open(files[0], "r+b") as f:
            f.seek(victim.phys_offset + 4)
            f.write(bytes(SEG - victim.phys_offset - 4))

    rows, sums = read_all(store, 7000)
    kept = [m.phys_offset for m in msgs if not victim.phys_offset <= m.phys_offset < SEG]
    assert [r["phys_offset"] for r in rows] == kept
    want = [(victim.phys_offset, SEG - victim.phys_offset, "bad_magic", True)]
    if how == "truncated":
        want = [
            (victim.phys_offset, cut - victim.phys_offset, "torn", True),
            (cut, SEG - cut, "segment_gap", True),
        ]
    assert [(b["log_offset"], b["length"], b["reason"], b["final"]) for b in bad_of(sums)] == want


def test_zeros_instead_of_a_closing_blank_are_accounted_for(tmp_path: Path) -> None:
    store = tmp_path / "store"
    write_store(store, varied(400))
    msgs = stored(store)
    first = [m for m in msgs if m.phys_offset < SEG]
    at = first[-3].phys_offset  # zero the last 3 units and the blank: no unit is cut
    with open(segment_files(store)[0], "r+b") as f:
        f.seek(at)
        f.write(bytes(SEG - at))
    rows, sums = read_all(store, 5000)
    assert len(rows) == len(msgs) - 3
    got = [(b["log_offset"], b["length"], b["reason"]) for b in bad_of(sums)]
    assert got == [(at, SEG - at, "no_blank")]
