"""Verified message units of a segment -> one RAW_MESSAGE Arrow record batch, vectorised.

Headers come from one numpy gather; bodies, topics and properties are copied once into Arrow
buffers; body CRCs are computed per unit with zlib (C speed); hosts, offset msgIds and the
property maps are built with numpy and Arrow kernels, not per row in Python.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
from numpy.lib.stride_tricks import sliding_window_view

from broker_runtime.common.message import PROPERTY_SEPARATOR
from broker_runtime.store import record_codec as codec
from pipeline.readers.segments import I64, U8, BadRange, SegmentWalker, WalkResult
from pipeline.schemas import RAW_MESSAGE, arrow_schema

_PAD_LIMIT = 64 << 20  # bytes a padded gather may allocate


def _take_bytes(walker: SegmentWalker, starts: I64, lens: I64) -> tuple[pa.Buffer, pa.Buffer]:
    """(int32 offsets, data) Arrow buffers of the slices [starts[i], starts[i] + lens[i]).

    Slices of similar length (the usual case) are copied by one numpy gather of rows padded
    to the longest, then compacted; very uneven ones by joining memoryview slices.
    """
    n = len(starts)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lens, out=offsets[1:])
    total = int(offsets[-1])
    longest = int(lens.max()) if n else 0
    padded_size = longest * n
    if (
        0 < longest
        and padded_size <= min(2 * total + 64 * n, _PAD_LIMIT)
        and int(starts.max()) + longest <= walker.size
    ):
        rows = sliding_window_view(walker.arr, longest)[starts]
        if int(lens.min()) == longest:
            data: bytes | npt.NDArray[np.uint8] = rows.reshape(-1)
        else:
            data = rows[np.arange(longest) < lens[:, None]]
    else:
        buf, pairs = walker.buf, zip(starts.tolist(), lens.tolist(), strict=True)
        data = b"".join([buf[s : s + k] for s, k in pairs])
    return pa.py_buffer(offsets), pa.py_buffer(data)


def _strings(walker: SegmentWalker, starts: I64, lens: I64) -> tuple[pa.Array, list[int]]:
    """A string array of the slices; rows that are not UTF-8 are decoded with replacement
    and their indexes returned."""
    buffers = [None, *_take_bytes(walker, starts, lens)]
    raw = pa.Array.from_buffers(pa.binary(), len(starts), buffers)
    try:
        return raw.cast(pa.string()), []
    except pa.ArrowInvalid:
        out, bad = [], []
        for i, v in enumerate(raw.to_pylist()):
            try:
                out.append(v.decode())
            except UnicodeDecodeError:
                bad.append(i)
                out.append(v.decode(errors="replace"))
        return pa.array(out, pa.string()), bad


_RAW_ARROW = arrow_schema(RAW_MESSAGE)
# One property: name, then \x01, then the value (which may itself hold \x01).
_PROPERTY = r"(?s)^(?P<k>[^\x01]*)\x01(?P<v>.*)$"


_HEX = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)


def _be_bytes(values: npt.NDArray[Any]) -> U8:
    """The big-endian bytes of a big-endian field, one row per value."""
    return np.ascontiguousarray(values).view(np.uint8).reshape(len(values), -1)


def offset_msg_ids(h: npt.NDArray[np.void]) -> pa.StringArray:
    """RocketMQ's offset msgId of each unit: store host (4 + 4 bytes) and log offset (8 bytes)
    as 32 upper-case hex digits (common.message.offset_msg_id, vectorised)."""
    raw = np.concatenate(
        [_be_bytes(h["store_ip"]), _be_bytes(h["store_port"]), _be_bytes(h["phys"])], axis=1
    )
    digits = np.empty((len(h), 32), dtype=np.uint8)
    digits[:, 0::2] = _HEX[raw >> 4]
    digits[:, 1::2] = _HEX[raw & 15]
    offsets = np.arange(0, 32 * len(h) + 1, 32, dtype=np.int32)
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(digits)]
    return pa.Array.from_buffers(pa.string(), len(h), buffers)


def hosts(ip: npt.NDArray[Any], port: npt.NDArray[Any]) -> pa.StringArray:
    """`a.b.c.d:port` per unit; a batch has few distinct hosts, each formatted once."""
    key = (ip.astype(np.uint64) << np.uint64(32)) | port.astype(np.uint32).astype(np.uint64)
    distinct, index = np.unique(key, return_inverse=True)
    text = []
    for d in distinct.tolist():
        k, p = d >> 32, d & 0xFFFFFFFF
        port_value = p - (1 << 32) if p >= 1 << 31 else p  # an i32, as decode_host reads it
        text.append(f"{k >> 24 & 255}.{k >> 16 & 255}.{k >> 8 & 255}.{k & 255}:{port_value}")
    return pa.array(text, pa.string()).take(pa.array(index.astype(np.int32)))


def properties_map(text: pa.StringArray) -> pa.MapArray:
    """`k\x01v\x02...` strings -> map<string, string>, as string_to_properties reads them
    (items without a separator are skipped), vectorised with Arrow compute kernels."""
    items = pc.split_pattern(text, PROPERTY_SEPARATOR)
    parent = pc.list_parent_indices(items)
    kv = pc.extract_regex(pc.list_flatten(items), _PROPERTY)
    ok = pc.is_valid(kv)
    kv, parent = kv.filter(ok), parent.filter(ok)
    counts = np.bincount(parent.to_numpy(zero_copy_only=False), minlength=len(text))
    offsets = np.zeros(len(text) + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.MapArray.from_arrays(pa.array(offsets), kv.field("k"), kv.field("v"))


def to_batch(
    walker: SegmentWalker, pos: I64, broker: str, broker_id: int, result: WalkResult
) -> pa.RecordBatch:
    """The RAW_MESSAGE batch of the verified units at `pos`; bad CRCs are also reported."""
    n = len(pos)
    h = walker.headers(pos)

    def col(name: str, dtype: type[np.generic]) -> pa.Array:
        return pa.array(h[name].astype(dtype))

    body_len = h["body_len"].astype(np.int64)
    body_at = pos + codec.HEADER_SIZE
    topic_len = walker.arr[body_at + body_len].astype(np.int64)
    props_at = body_at + body_len + 1 + topic_len
    props_len = (walker.arr[props_at].astype(np.int64) << 8) | walker.arr[props_at + 1]
    body_offsets, body_data = _take_bytes(walker, body_at, body_len)
    body = pa.Array.from_buffers(pa.binary(), n, [None, body_offsets, body_data])
    data, offs = memoryview(body_data), np.frombuffer(body_offsets, dtype=np.int32).tolist()
    crcs = np.array([zlib.crc32(data[offs[i] : offs[i + 1]]) for i in range(n)], dtype=np.int64)
    crcs &= 0x7FFFFFFF
    stored_crc = h["crc"].astype(np.int32)
    crc_ok = crcs == stored_crc
    topic, bad_topic = _strings(walker, body_at + body_len + 1, topic_len)
    props, bad_props = _strings(walker, props_at + 2, props_len)
    for i in np.flatnonzero(~crc_ok).tolist():
        p = int(pos[i])
        detail = f"BODYCRC {int(stored_crc[i])}, body CRC {int(crcs[i])}"
        result.bad.append(BadRange(p, int(h["total"][i]), "bad_crc", detail, True))
    for i in sorted(set(bad_topic) | set(bad_props)):
        p = int(pos[i])
        result.bad.append(BadRange(p, int(h["total"][i]), "bad_text", "topic or properties "
                                   "are not UTF-8 (kept with replacement)", True))  # fmt: skip
    result.units += n
    result.unit_bytes += int(h["total"].astype(np.int64).sum())
    columns = [
        pa.array([broker] * n, pa.string()),
        pa.array(np.full(n, broker_id, dtype=np.int32)),
        pa.array(pos + walker.file_from),
        offset_msg_ids(h),
        col("total", np.int32),
        pa.array(stored_crc),
        pa.array(crc_ok),
        col("queue_id", np.int32),
        col("flag", np.int32),
        col("queue_offset", np.int64),
        col("sys_flag", np.int32),
        col("born_ts", np.int64),
        hosts(h["born_ip"], h["born_port"]),
        col("store_ts", np.int64),
        hosts(h["store_ip"], h["store_port"]),
        col("reconsume", np.int32),
        col("ptx", np.int64),
        pa.array(body_len.astype(np.int32)),
        body,
        topic,
        properties_map(props),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=_RAW_ARROW)
