"""Fuzz targets: bytes in, an asserted outcome (AssertionError when the outcome is wrong).

Run by the Hypothesis tests (tests/unit/...) and by the coverage-guided fuzzer (atheris,
tests/fuzz/run.py) over the corpus kept in tests/fuzz/corpus/<target>/. Each target says what
a correct outcome is: a clean, named error, or a result that survives a round trip or agrees
with its twin implementation. Any other exception escaping is a finding too.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable

import numpy as np

from broker_runtime.common.message import properties_to_string, string_to_properties
from broker_runtime.remoting import command
from broker_runtime.remoting.command import HeaderError, RemotingCommand
from broker_runtime.remoting.framing import FrameDecoder, FrameError, encode
from broker_runtime.store import inspection
from broker_runtime.store import record_codec as codec
from broker_runtime.store.segment_scan import BadRange
from pipeline.readers import unit_batch
from pipeline.readers.segments import SegmentWalker, WalkResult
from tests.unit.pipeline.stores import unit

MAX_FRAME = 1 << 16
_I32 = struct.Struct(">i")


def _fields(cmd: RemotingCommand) -> tuple[object, ...]:
    return (cmd.code, cmd.opaque, cmd.flag, cmd.remark, cmd.ext_fields, cmd.version,
            cmd.language, cmd.body)  # fmt: skip


def frame(data: bytes) -> None:
    """The frame decoder: a FrameError with a reason, or commands that are exactly the
    frames at the front of `data` (the rest buffered) and survive encode -> decode; a
    command encoded by us decodes and re-encodes to the same bytes."""
    decoder = FrameDecoder(max_frame=MAX_FRAME)
    try:
        cmds = decoder.feed(data)
    except FrameError as e:
        assert str(e), "a FrameError names its reason"
        return
    pos = 0
    for _ in cmds:
        pos += 4 + _I32.unpack_from(data, pos)[0]
    assert decoder.buffered == len(data) - pos, (decoder.buffered, len(data), pos)
    for cmd in cmds:
        raw = encode(cmd)
        (back,) = FrameDecoder(max_frame=len(raw)).feed(raw)
        assert _fields(back) == _fields(cmd)
        assert encode(back) == raw


def header(data: bytes) -> None:
    """The header codec's C twin: the Python decoder's result, or None (Python decides);
    where Python refuses (HeaderError) the twin answers None. Without the twin built, the
    Python decoder alone: a command or a HeaderError."""
    try:
        want = RemotingCommand.decode_header_py(data, b"")
    except HeaderError as e:
        assert str(e)
        want = None
    native = command._native
    if native is None:
        return
    got = native.decode(data)
    if want is None:
        assert got is None, got
    elif got is not None:
        expected = _fields(want)[:-1]
        assert got == expected, (got, expected)
        assert [type(x) for x in got] == [type(x) for x in expected]


def properties(data: bytes) -> None:
    """The properties parser, and the reader kernel's parser of a unit's PROPERTIES bytes:
    the Python parser's map (text with replacement where not UTF-8), which survives
    properties_to_string -> string_to_properties; the C kernel reads what its twin reads."""
    raw = data[: codec.MAX_PROPERTIES_LENGTH]
    text = raw.decode(errors="replace")
    props = string_to_properties(text)
    assert string_to_properties(properties_to_string(props)) == props
    one = unit(raw)
    twin = unit_batch.scan_units_py(one, 0, 0, len(one))
    assert twin.n == 1 and twin.end == len(one)
    assert twin.bad_text == ([] if text.encode() == raw else [0])
    got = unit_batch.scan_units(one, 0, 0, len(one))
    assert (got.n, got.end, got.full, got.bad_text) == (1, len(one), False, twin.bad_text)
    assert [bytes(b) for b in got.buffers] == [bytes(b) for b in twin.buffers]


def commitlog(data: bytes) -> None:
    """A segment's bytes (after one good unit): `store verify`'s scan and the ingest
    reader's walk find the same units and damaged ranges, the ranges lie in the segment
    without overlapping units or each other, and every unit is structurally valid."""
    seg = FIRST_UNIT + data
    for last in (True, False):
        verify_bad: list[BadRange] = []
        verify_units = [
            pos for _phys, _view, pos in inspection.segment_units(seg, 0, last, verify_bad.append)
        ]
        result = WalkResult()
        walker = SegmentWalker(seg, 0, last)
        ingest_units: list[int] = []
        for units in walker.walk(0, len(seg), True, result):
            ingest_units += units.column("phys", np.int64).tolist()
        assert verify_units[0] == 0 and ingest_units[0] == 0
        for pos in verify_units:
            assert codec.check_unit(seg, pos, len(seg), check_crc=False) > 0
        # The reader holds back the log's last unit when its CRC fails (a write in flight):
        # a `torn` range where verify has a unit with a bad CRC. Otherwise the same.
        held = [b.position for b in result.bad if b.reason == "torn" and b.position in verify_units]
        assert sorted(ingest_units + held) == verify_units
        structural = [b for b in result.bad if b.reason not in ("bad_crc", "bad_text")]
        assert [b for b in structural if b.position not in held] == verify_bad
        _disjoint(seg, verify_units, verify_bad)


FIRST_UNIT = unit(b"UNIQ_KEY\x01a\x02")


def _disjoint(seg: bytes, units: list[int], bad: list[BadRange]) -> None:
    spans = sorted(
        [(p, p + codec.check_unit(seg, p, len(seg), check_crc=False)) for p in units]
        + [(b.position, b.position + b.length) for b in bad]
    )
    for (a0, a1), (b0, _b1) in itertools.pairwise(spans):
        assert a0 < a1 <= b0, spans
    assert not spans or spans[-1][1] <= len(seg), spans


TARGETS: dict[str, Callable[[bytes], None]] = {
    "frame": frame,
    "header": header,
    "properties": properties,
    "commitlog": commitlog,
}
