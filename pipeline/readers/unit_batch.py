"""A run of valid message units -> their RAW_MESSAGE columns, decoded once.

`scan_units` follows the TOTALSIZE chain from a unit boundary while units are structurally
valid (the codec's check without the CRC, and PHYSICALOFFSET = their own log offset) and
decodes them straight into Arrow buffers. The C kernel (_scan.c) does it in one pass over
the mapped segment with no Python object per message. Its pure twin `scan_units_py` (the
broker's record codec per unit: slow) runs where the kernel was not built or
MQAUDIT_STORE_PURE=1 is set, and is the reference the tests hold the kernel to.

Text that is not UTF-8 is kept decoded with replacement (its rows are listed); properties
read as `string_to_properties` reads them (a repeated name: first place, last value), and the
ones in PICKED also come as columns of their own.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from broker_runtime.common.message import (
    DELAY,
    KEYS,
    ORIGIN_MESSAGE_ID,
    REAL_TOPIC,
    REPLAY_OF_PROPERTY,
    RETRY_TOPIC,
    TAGS,
    UNIQ_KEY,
    string_to_properties,
)
from broker_runtime.store import record_codec as codec
from broker_runtime.store.accel import PURE_ENV
from pipeline.schemas import RAW_MESSAGE, arrow_schema

MAX_UNITS = 8192  # units per batch
MAX_BYTES = 32 << 20  # unit bytes per batch (at least one unit)

# The kernel's output columns, in its order (_scan.c: enum C_*): Arrow buffers.
COLUMNS = (
    "phys", "msg_id", "total", "crc", "crc_ok", "queue_id", "flag", "queue_offset", "sys_flag",
    "born_ts", "born_host_off", "born_host", "store_ts", "store_host_off", "store_host",
    "reconsume", "ptx", "body_len", "body_off", "body", "topic_off", "topic", "map_off",
    "key_off", "key", "value_off", "value",
)  # fmt: skip
# The columns after RAW_MESSAGE's in a batch: property name by column.
PICKED = {
    "prop_uniq_key": UNIQ_KEY,
    "prop_keys": KEYS,
    "prop_tags": TAGS,
    "prop_retry_topic": RETRY_TOPIC,
    "prop_real_topic": REAL_TOPIC,
    "prop_origin_message_id": ORIGIN_MESSAGE_ID,
    "prop_replay_of": REPLAY_OF_PROPERTY,
    "prop_delay": DELAY,
}
_NAMES = tuple(name.encode() for name in PICKED.values())
_RAW_ARROW = pa.schema([*arrow_schema(RAW_MESSAGE), *(pa.field(c, pa.string()) for c in PICKED)])
_MAP = _RAW_ARROW.field("properties").type


def _load_kernel() -> Any:
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return None
    try:
        mod = importlib.import_module("pipeline.readers._scan")
    except ImportError:
        return None
    return mod if mod.N_COLUMNS == len(COLUMNS) else None  # else: built from other sources


@dataclass(frozen=True)
class Units:
    """Decoded units: `end` is the first position not taken, `full` whether the batch limit
    (not `stop` or a bad unit) ended the run."""

    end: int
    full: bool
    n: int
    buffers: tuple[Any, ...]  # bytes-likes in COLUMNS order, then 3 per PICKED name
    bad_text: list[int]  # rows whose topic or properties were not UTF-8

    def column(self, name: str, dtype: type[np.generic]) -> np.ndarray[Any, Any]:
        """A fixed-width column as numpy (a view)."""
        return np.frombuffer(self.buffers[COLUMNS.index(name)], dtype=dtype, count=self.n)

    def crc_ok(self) -> np.ndarray[Any, np.dtype[np.bool_]]:
        bits = np.frombuffer(self.buffers[COLUMNS.index("crc_ok")], dtype=np.uint8)
        return np.unpackbits(bits, count=self.n, bitorder="little").astype(bool)

    def head(self, n: int) -> Units:
        """The first n units (their buffers are shared, the columns sliced later)."""
        return Units(self.end, self.full, n, self.buffers, self.bad_text)

    def to_batch(self, broker: str, broker_id: int) -> pa.RecordBatch:
        """The RAW_MESSAGE record batch, then the PICKED columns (zero-copy over the buffers)."""
        n = self.n
        b = dict(zip(COLUMNS, map(pa.py_buffer, self.buffers[: len(COLUMNS)]), strict=True))

        def fixed(kind: pa.DataType, name: str) -> pa.Array:
            return pa.Array.from_buffers(kind, n, [None, b[name]])

        def text(kind: pa.DataType, offsets: str, data: str, count: int = n) -> pa.Array:
            return pa.Array.from_buffers(kind, count, [None, b[offsets], b[data]])

        def same(value: bytes) -> pa.Array:  # one string n times, built as its buffers
            offsets = np.arange(0, len(value) * (n + 1), len(value), dtype=np.int32)
            return pa.Array.from_buffers(
                pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(value * n)]
            )

        ids = pa.py_buffer(np.arange(0, 32 * (n + 1), 32, dtype=np.int32))
        map_offsets = pa.Array.from_buffers(pa.int32(), n + 1, [None, b["map_off"]])
        entries = int(map_offsets[-1].as_py()) if n else 0
        properties = pa.MapArray.from_arrays(
            map_offsets,
            text(pa.string(), "key_off", "key", entries),
            text(pa.string(), "value_off", "value", entries),
            type=_MAP,
        )
        columns = [
            same(broker.encode()),
            pa.Array.from_buffers(
                pa.int32(), n, [None, pa.py_buffer(np.full(n, broker_id, np.int32))]
            ),
            fixed(pa.int64(), "phys"),
            pa.Array.from_buffers(pa.string(), n, [None, ids, b["msg_id"]]),
            fixed(pa.int32(), "total"),
            fixed(pa.int32(), "crc"),
            fixed(pa.bool_(), "crc_ok"),
            fixed(pa.int32(), "queue_id"),
            fixed(pa.int32(), "flag"),
            fixed(pa.int64(), "queue_offset"),
            fixed(pa.int32(), "sys_flag"),
            fixed(pa.int64(), "born_ts"),
            text(pa.string(), "born_host_off", "born_host"),
            fixed(pa.int64(), "store_ts"),
            text(pa.string(), "store_host_off", "store_host"),
            fixed(pa.int32(), "reconsume"),
            fixed(pa.int64(), "ptx"),
            fixed(pa.int32(), "body_len"),
            text(pa.binary(), "body_off", "body"),
            text(pa.string(), "topic_off", "topic"),
            properties,
        ]
        for i in range(len(PICKED)):
            validity, offsets, data = self.buffers[len(COLUMNS) + 3 * i : len(COLUMNS) + 3 * i + 3]
            columns.append(
                pa.Array.from_buffers(
                    pa.string(), n, [pa.py_buffer(x) for x in (validity, offsets, data)]
                )
            )
        return pa.RecordBatch.from_arrays(columns, schema=_RAW_ARROW)


def file_reader(fd: int) -> Any | None:
    """A reader of the segment file `fd` for `scan_units` (the kernel's Reader: preads into a
    window that stays in cache instead of mapped pages; the fd is duplicated), or None where
    the kernel is not built (the twin reads the mapped bytes)."""
    return None if _KERNEL is None else _KERNEL.Reader(fd)


def scan_units(
    data: Any, file_from: int, pos: int, stop: int, max_units: int = MAX_UNITS, reader: Any = None
) -> Units:
    """The valid units of `data` (a segment's bytes) from `pos` that start before `stop`;
    with a `file_reader` of the same segment, their bytes are read from its file."""
    if _KERNEL is not None:
        end, full, n, buffers, bad = _KERNEL.scan(
            data, file_from, pos, stop, max_units, MAX_BYTES, _NAMES, reader
        )
        return Units(end, full, n, buffers, bad)
    return scan_units_py(data, file_from, pos, stop, max_units)


def _valid_size(view: memoryview, file_from: int, pos: int) -> int:
    """Size of the valid unit at `pos`, 0 if there is none (the kernel's acceptance rule)."""
    try:
        size = codec.check_unit(view, pos, len(view), check_crc=False)
    except codec.RecordError:
        return 0
    if size < 0:
        return 0  # the blank unit
    h = codec.HEADER.unpack_from(view, pos)
    props_len_at = pos + codec.HEADER_SIZE + h[16] + 1 + view[pos + codec.HEADER_SIZE + h[16]]
    props_ok = int.from_bytes(view[props_len_at : props_len_at + 2], "big") < 0x8000
    return size if props_ok and h[6] == file_from + pos else 0


def scan_units_py(
    data: Any, file_from: int, pos: int, stop: int, max_units: int = MAX_UNITS
) -> Units:
    """`scan_units` in Python (the C kernel's twin)."""
    view = memoryview(data)
    cols: dict[str, list[Any]] = {name: [] for name in (*COLUMNS, "properties")}
    bad: list[int] = []
    taken = 0
    full = False
    while pos < stop:
        size = _valid_size(view, file_from, pos)
        if not size:
            break
        if len(cols["phys"]) == max_units or (cols["phys"] and taken + size > MAX_BYTES):
            full = True
            break
        h = codec.HEADER.unpack_from(view, pos)
        body = bytes(view[pos + codec.HEADER_SIZE : pos + codec.HEADER_SIZE + h[16]])
        t = pos + codec.HEADER_SIZE + len(body)
        raw_topic = bytes(view[t + 1 : t + 1 + view[t]])
        raw_props = bytes(view[t + 3 + len(raw_topic) : pos + size])
        topic, props = raw_topic.decode(errors="replace"), raw_props.decode(errors="replace")
        if topic.encode() != raw_topic or props.encode() != raw_props:
            bad.append(len(cols["phys"]))
        values = {
            "phys": file_from + pos, "total": h[0], "crc": h[2], "queue_id": h[3], "flag": h[4],
            "queue_offset": h[5], "sys_flag": h[7], "born_ts": h[8], "store_ts": h[11],
            "reconsume": h[14], "ptx": h[15], "body_len": h[16], "body": body,
            "crc_ok": codec.body_crc(body) == h[2], "topic": topic.encode(),
            "msg_id": (h[12] + h[13].to_bytes(4, "big", signed=True) + h[6].to_bytes(8, "big"))
            .hex().upper().encode(),
            "born_host": _host(h[9], h[10]), "store_host": _host(h[12], h[13]),
            "properties": string_to_properties(props),
        }  # fmt: skip
        for name, value in values.items():
            cols[name].append(value)
        taken += size
        pos += size
    n = len(cols["phys"])
    out: dict[str, Any] = {}
    for name in ("phys", "queue_offset", "born_ts", "store_ts", "ptx"):
        out[name] = np.array(cols[name], dtype=np.int64).tobytes()
    for name in ("total", "crc", "queue_id", "flag", "sys_flag", "reconsume", "body_len"):
        out[name] = np.array(cols[name], dtype=np.int32).tobytes()
    out["crc_ok"] = np.packbits(np.array(cols["crc_ok"], dtype=bool), bitorder="little").tobytes()
    out["msg_id"] = b"".join(cols["msg_id"])
    for name in ("born_host", "store_host", "body", "topic"):
        out[f"{name}_off"], out[name] = _offsets(cols[name])
    maps = cols["properties"]
    out["map_off"] = _cumsum([len(p) for p in maps])
    out["key_off"], out["key"] = _offsets([k.encode() for p in maps for k in p])
    out["value_off"], out["value"] = _offsets([v.encode() for p in maps for v in p.values()])
    picked = []
    for name in PICKED.values():
        found = [p.get(name) for p in maps]
        valid = np.packbits(np.array([v is not None for v in found], bool), bitorder="little")
        picked += [valid.tobytes(), *_offsets([(v or "").encode() for v in found])]
    return Units(pos, full, n, tuple(out[name] for name in COLUMNS) + tuple(picked), bad)


def _host(ip: bytes, port: int) -> bytes:
    return f"{ip[0]}.{ip[1]}.{ip[2]}.{ip[3]}:{port}".encode()


def _cumsum(lengths: list[int]) -> bytes:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return offsets.tobytes()


def _offsets(values: list[bytes]) -> tuple[bytes, bytes]:
    return _cumsum([len(v) for v in values]), b"".join(values)


_KERNEL = _load_kernel()
IMPLEMENTATION = "c" if _KERNEL is not None else "python"
