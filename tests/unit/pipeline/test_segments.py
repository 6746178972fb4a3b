"""The CommitLog reader against stores written by the broker's own store (no Spark)."""

from __future__ import annotations

import importlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from broker_runtime.common.message import string_to_properties
from broker_runtime.store import record_codec as codec
from broker_runtime.store.accel import PURE_ENV
from broker_runtime.store.segment_scan import nonzero_at
from pipeline.readers import unit_batch
from pipeline.readers.commitlog import Broker, plan_log, read_range, segment_files, summary
from pipeline.readers.segments import WalkResult
from tests.unit.pipeline.stores import stored, unit, varied, write_store

UNDER_CI = os.environ.get("CI") == "true"
PURE = os.environ.get(PURE_ENV, "") not in ("", "0")
# Skipped where the kernel is not built, except under CI: there a missing kernel must fail.
needs_kernel = pytest.mark.skipif(
    unit_batch.IMPLEMENTATION != "c" and not UNDER_CI, reason="C kernel not built"
)


@pytest.mark.skipif(PURE, reason=f"{PURE_ENV} is set: the reader runs its Python twin")
def test_the_reader_kernel_is_built() -> None:
    """A failed or stale build leaves the pure twin running: a skip here, a failure under CI
    (as the store's and the header codec's kernels)."""
    try:
        mod = importlib.import_module("pipeline.readers._scan")
        why = f"built from other sources ({mod.N_COLUMNS} columns, {len(unit_batch.COLUMNS)} here)"
    except ImportError as e:
        why = f"not built: {e}"
    if unit_batch.IMPLEMENTATION != "c":
        if UNDER_CI:
            pytest.fail(f"pipeline.readers._scan is {why}")
        pytest.skip(f"pipeline.readers._scan is {why}")


def read_all(
    store_dir: Path, range_bytes: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rows, summaries) of reading the whole log in ranges of `range_bytes`."""
    rows: list[dict[str, Any]] = []
    sums = []
    for task in plan_log(Broker("b", 0, str(store_dir)), 0, range_bytes).tasks:
        result = WalkResult()
        for batch in read_range(task, result):
            rows += batch.to_pylist()
        sums.append(summary(task, result))
    return rows, sums


def bad_of(sums: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted((b for s in sums for b in s["bad"]), key=lambda b: b["log_offset"])


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("seg") / "store"
    write_store(path, varied(400))
    return path


@pytest.mark.parametrize("range_bytes", [1 << 10, 7 * 1024 + 3, 64 << 10, 1 << 30])
def test_every_unit_once_with_every_field(store: Path, range_bytes: int) -> None:
    want = stored(store)
    rows, sums = read_all(store, range_bytes)
    assert [r["phys_offset"] for r in rows] == [m.phys_offset for m in want]
    for r, m in zip(rows, want, strict=True):
        assert r["total_size"] == m.total_size and r["body_crc"] == m.body_crc and r["crc_ok"]
        assert (r["queue_id"], r["flag"], r["queue_offset"], r["sys_flag"]) == (
            m.queue_id, m.flag, m.queue_offset, m.sys_flag,
        )  # fmt: skip
        assert (r["born_ts"], r["store_ts"]) == (m.born_timestamp, m.store_timestamp)
        assert r["born_host"] == f"{m.born_host[0]}:{m.born_host[1]}"
        assert r["store_host"] == f"{m.store_host[0]}:{m.store_host[1]}"
        assert r["msg_id"] == m.msg_id
        assert (r["reconsume_times"], r["prepared_tx_offset"]) == (
            m.reconsume_times, m.prepared_transaction_offset,
        )  # fmt: skip
        assert (r["body"], r["body_size"], r["topic"]) == (m.body, len(m.body), m.topic)
        assert dict(r["properties"]) == m.properties
    assert bad_of(sums) == []
    assert max(s["end"] for s in sums) == want[-1].phys_offset + want[-1].total_size


@needs_kernel
def test_the_pure_twin_reads_what_the_kernel_reads(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernel_rows, kernel_sums = read_all(store, 7 * 1024 + 3)
    monkeypatch.setattr(unit_batch, "_KERNEL", None)
    assert read_all(store, 7 * 1024 + 3) == (kernel_rows, kernel_sums)


def _corrupt(store: Path, offset: int, data: bytes) -> None:
    path = [p for p in segment_files(store) if int(p.name) <= offset][-1]
    with open(path, "r+b") as f:
        f.seek(offset - int(path.name))
        f.write(data)


@pytest.fixture
def fresh(tmp_path: Path) -> Path:
    write_store(tmp_path / "store", varied(120))
    return tmp_path / "store"


def test_flipped_body_byte_is_kept_and_reported_bad_crc(fresh: Path) -> None:
    m = stored(fresh)[40]
    body_at = m.phys_offset + codec.HEADER_SIZE
    _corrupt(fresh, body_at + 1, bytes([m.body[1] ^ 0xFF]))
    rows, sums = read_all(fresh, 5000)
    assert len(rows) == 120
    bad_rows = [r for r in rows if not r["crc_ok"]]
    assert [r["phys_offset"] for r in bad_rows] == [m.phys_offset]
    assert [(b["log_offset"], b["reason"], b["final"]) for b in bad_of(sums)] == [
        (m.phys_offset, "bad_crc", True)
    ]


@pytest.mark.parametrize(
    ("at", "data", "reason"),
    [
        (4, b"\x00\x00\x00\x01", "bad_magic"),
        (0, b"\x00\x00\x00\x10", "bad_size"),
        (28, b"\x00" * 8, "bad_offset"),
        (0, b"\xff" * 40, "bad_magic"),
    ],
)
def test_damage_in_the_middle_is_skipped_to_the_next_unit(
    fresh: Path, at: int, data: bytes, reason: str
) -> None:
    msgs = stored(fresh)
    victim = msgs[50]
    _corrupt(fresh, victim.phys_offset + at, data)
    rows, sums = read_all(fresh, 3000)
    assert [r["phys_offset"] for r in rows] == [m.phys_offset for m in msgs if m is not victim]
    assert [(b["log_offset"], b["length"], b["reason"], b["final"]) for b in bad_of(sums)] == [
        (victim.phys_offset, victim.total_size, reason, True)
    ]


def test_torn_tail_is_quarantined_not_final(fresh: Path) -> None:
    msgs = stored(fresh)
    last = msgs[-1]
    end = last.phys_offset + last.total_size
    raw = Path(segment_files(fresh)[-1]).read_bytes()
    unit = raw[last.phys_offset - int(segment_files(fresh)[-1].name) :][: last.total_size]
    _corrupt(fresh, end, unit[: last.total_size // 2])  # half a unit after the last one
    rows, sums = read_all(fresh, 1 << 20)
    assert len(rows) == len(msgs)
    [bad] = bad_of(sums)
    assert (bad["log_offset"], bad["reason"], bad["final"]) == (end, "torn", False)
    assert min(s["pending_from"] for s in sums if s["pending_from"] is not None) == end


def test_bad_crc_on_the_last_unit_is_a_torn_tail(fresh: Path) -> None:
    msgs = stored(fresh)
    last = msgs[-1]
    assert last.body
    _corrupt(fresh, last.phys_offset + codec.HEADER_SIZE, bytes([last.body[0] ^ 1]))
    rows, sums = read_all(fresh, 1 << 20)
    assert len(rows) == len(msgs) - 1  # held back: it may be a write still in flight
    assert [(b["log_offset"], b["reason"], b["final"]) for b in bad_of(sums)] == [
        (last.phys_offset, "torn", False)
    ]


def test_zeroed_unit_is_a_zero_gap_and_garbage_after_the_tail_is_reported(fresh: Path) -> None:
    msgs = stored(fresh)
    victim = msgs[30]
    _corrupt(fresh, victim.phys_offset, bytes(victim.total_size))
    last = msgs[-1]
    _corrupt(fresh, last.phys_offset + last.total_size + 100, b"garbage!")
    rows, sums = read_all(fresh, 2048)
    assert len(rows) == len(msgs) - 1
    got = [(b["log_offset"], b["reason"], b["final"]) for b in bad_of(sums)]
    assert got == [
        (victim.phys_offset, "zero_gap", True),
        (last.phys_offset + last.total_size, "garbage", False),
    ]


Scan = Callable[..., unit_batch.Units]
KERNELS = [
    pytest.param(unit_batch.scan_units, id="c", marks=needs_kernel),
    pytest.param(unit_batch.scan_units_py, id="python"),
]


@pytest.mark.parametrize("scan", KERNELS)
@settings(deadline=None)  # correctness only: a loaded machine must not fail it
@given(
    st.lists(st.tuples(st.text(max_size=5), st.text(max_size=5)), max_size=20),
    st.sampled_from(["", "junk\x02", "\x02\x02", "tail-without-separator"]),
)
def test_properties_read_as_the_broker_reads_them(
    scan: Scan, pairs: list[tuple[str, str]], junk: str
) -> None:
    pairs = [(k.replace("\x01", "").replace("\x02", ""), v.replace("\x02", "")) for k, v in pairs]
    text = "".join(f"{k}\x01{v}\x02" for k, v in pairs) + junk
    data = unit(text.encode()) + unit(b"", phys=codec.record_size(4, 1, len(text.encode())))
    units = scan(data, 0, 0, len(data))
    got = units.to_batch("b", 0).column("properties").to_pylist()
    assert got[0] == list(string_to_properties(text).items())  # first place, last value
    assert (got[1], units.n, units.end, units.bad_text) == ([], 2, len(data), [])


@pytest.mark.parametrize("scan", KERNELS)
def test_text_that_is_not_utf8_is_replaced_and_listed(scan: Scan) -> None:
    good = unit(b"k\x01v\x02")
    bad_props = b"k\x01\xff\xfe\xc3\x02\xed\xa0\x80\x01x\x02"
    data = good + unit(bad_props, topic=b"T\xe9", phys=len(good))
    units = scan(data, 0, 0, len(data))
    batch = units.to_batch("b", 0).to_pylist()
    assert units.bad_text == [1]
    assert batch[1]["topic"] == b"T\xe9".decode(errors="replace")
    assert batch[1]["properties"] == list(
        string_to_properties(bad_props.decode(errors="replace")).items()
    )
    assert (batch[0]["born_host"], batch[0]["store_host"]) == ("10.0.0.1:9876", "10.0.0.1:-1")


@pytest.mark.parametrize("scan", KERNELS)
def test_a_run_stops_at_the_batch_limit_and_before_a_bad_unit(scan: Scan) -> None:
    units: list[bytes] = []
    for i in range(5):
        prev = sum(len(u) for u in units)
        units.append(unit(b"k\x01v\x02", body=bytes([i]) * i, phys=prev))
    data = b"".join(units)
    first = scan(data, 0, 0, len(data), max_units=3)
    assert (first.n, first.full, first.end) == (3, True, sum(len(u) for u in units[:3]))
    damaged = data[: first.end] + b"\x00" * 8 + data[first.end + 8 :]
    rest = scan(damaged, 0, 0, len(damaged))
    assert (rest.n, rest.full, rest.end) == (3, False, first.end)
    assert [r["body"] for r in rest.to_batch("b", 0).to_pylist()] == [b"", b"\x01", b"\x02\x02"]


def units_of(bodies: list[int]) -> bytes:
    """Consecutive valid units from log offset 0 with bodies of the given sizes."""
    out = b""
    for i, n in enumerate(bodies):
        props = f"UNIQ_KEY\x01u{i}\x02TAGS\x01t{i % 3}\x02".encode()
        out += unit(props, body=bytes([i % 251]) * n, phys=len(out))
    return out


def assert_same(got: unit_batch.Units, want: unit_batch.Units) -> None:
    assert (got.end, got.full, got.n, got.bad_text) == (want.end, want.full, want.n, want.bad_text)
    assert got.to_batch("b", 0).equals(want.to_batch("b", 0))


@needs_kernel
@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(0, 3000), min_size=1, max_size=12),
    st.binary(max_size=200),
    st.integers(1, 5000),
    st.integers(0, 5000),
    st.integers(1, 12),
    st.integers(0, 40_000),
)
@example([0, 100, 2999], b"", 1, 0, 1, 40_000)  # every unit bigger than the window
@example([1000, 1000, 1000], b"\x00" * 50, 1100, 0, 12, 40_000)  # units across window ends
def test_a_reader_decodes_what_the_mapped_bytes_hold(
    bodies: list[int], tail: bytes, chunk: int, extra: int, max_units: int, stop: int
) -> None:
    """Through a window of `chunk`-byte reads (units past `chunk + extra` from the map), batch
    after batch, whatever the window's ends cut; the file object closed meanwhile."""
    data = units_of(bodies) + tail
    stop = min(stop, len(data))
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "00000000000000000000"
        path.write_bytes(data)
        with open(path, "rb") as f:
            reader = unit_batch.file_reader(f.fileno())
            small = unit_batch._KERNEL.Reader(f.fileno(), chunk=chunk, big=chunk + extra)
        pos = 0
        while True:
            want = unit_batch.scan_units(data, 0, pos, stop, max_units)
            assert_same(unit_batch.scan_units(data, 0, pos, stop, max_units, reader), want)
            assert_same(unit_batch.scan_units(data, 0, pos, stop, max_units, small), want)
            if not want.full:
                break
            pos = want.end


@needs_kernel
@pytest.mark.parametrize("cut", [0, 7, 200, 1500, 2999, 3000])
def test_a_reader_stops_where_a_file_cut_since_it_was_mapped_ends(tmp_path: Path, cut: int) -> None:
    """The units wholly in the file are decoded; the walk stops at the first one cut off."""
    data = units_of([900, 900, 900, 900])
    path = tmp_path / "00000000000000000000"
    path.write_bytes(data[:cut])
    with open(path, "rb") as f:
        reader = unit_batch._KERNEL.Reader(f.fileno(), chunk=512)
    assert_same(
        unit_batch.scan_units(data, 0, 0, len(data), reader=reader),
        unit_batch.scan_units(data[:cut], 0, 0, len(data)),
    )


@needs_kernel
def test_reader_arguments_are_checked(tmp_path: Path) -> None:
    kernel = unit_batch._KERNEL
    with pytest.raises(OSError):
        kernel.Reader(-1)
    (tmp_path / "f").write_bytes(b"")
    with open(tmp_path / "f", "rb") as f:
        with pytest.raises(ValueError, match="chunk"):
            kernel.Reader(f.fileno(), chunk=0)
        with pytest.raises(ValueError, match="chunk"):
            kernel.Reader(f.fileno(), chunk=64, big=63)
    with pytest.raises(ValueError, match="out of range"):
        kernel.scan(b"", 0, 0, 0, 1, 1, (), object())


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, (3 << 20) - 1), max_size=4),
    st.integers(0, 3 << 20),
    st.integers(0, 3 << 20),
)
@example([4095, 4096], 0, 3 << 20)
@example([(1 << 20) - 1, 1 << 20], 4096, (2 << 20) + 1)
@example([(1 << 20) - 1], 1 << 20, 3 << 20)  # the only mark is before the range
@example([], 0, 3 << 20)
def test_nonzero_at_finds_the_first_and_last_non_zero_byte(
    marks: list[int], lo: int, hi: int
) -> None:
    """Across the 4 KiB pieces and 1 MiB chunks it tests separately, as np.flatnonzero."""
    arr = np.zeros(3 << 20, dtype=np.uint8)
    arr[marks] = 7
    nz = np.flatnonzero(arr[lo:hi])
    assert nonzero_at(arr, lo, hi, last=False) == (lo + int(nz[0]) if len(nz) else None)
    assert nonzero_at(arr, lo, hi, last=True) == (lo + int(nz[-1]) if len(nz) else None)
