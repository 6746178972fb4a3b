"""The HA wire format, as RocketMQ 4.x's HAConnection/HAClient speak it. No I/O.

slave -> master: its max CommitLog offset, 8 bytes (i64, big-endian), on connect, after
each transfer it appended, and as a heartbeat.
master -> slave: [phyOffset i64, bodySize i32] then bodySize bytes of CommitLog starting at
phyOffset; bodySize 0 is a heartbeat.
"""

from __future__ import annotations

import struct

REPORT = struct.Struct(">q")
TRANSFER_HEADER = struct.Struct(">qi")
MAX_TRANSFER = 64 << 20  # a body larger than this is not from a sane master


class HAProtocolError(ValueError):
    pass


def encode_report(max_offset: int) -> bytes:
    return REPORT.pack(max_offset)


def decode_report(raw: bytes) -> int:
    (offset,) = REPORT.unpack(raw)
    if offset < 0:
        raise HAProtocolError(f"slave reported a negative offset {offset}")
    return int(offset)


def encode_transfer(phys_offset: int, body: bytes) -> bytes:
    return TRANSFER_HEADER.pack(phys_offset, len(body)) + body


def decode_transfer_header(raw: bytes) -> tuple[int, int]:
    offset, size = TRANSFER_HEADER.unpack(raw)
    if offset < 0 or not 0 <= size <= MAX_TRANSFER:
        raise HAProtocolError(f"bad transfer header: offset {offset}, size {size}")
    return int(offset), int(size)
