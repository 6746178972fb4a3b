"""The `checkpoint` file: how far the log and the derived files were safely on disk.

Layout as RocketMQ's StoreCheckpoint (a 4 KiB file, big-endian): physicMsgTimestamp @0,
logicsMsgTimestamp @8, indexMsgTimestamp @16, then the flushed log offset @24 (RocketMQ 5
keeps masterFlushedOffset there) and, mqaudit's own, the log offset up to which the
ConsumeQueues and the index were flushed @32. Recovery starts from the smaller offset.
"""

from __future__ import annotations

import dataclasses
import os
import struct
from dataclasses import dataclass
from pathlib import Path

_LAYOUT = struct.Struct(">qqqqq")
FILE_SIZE = 4096


@dataclass
class Checkpoint:
    phys_timestamp: int = 0
    logics_timestamp: int = 0
    index_timestamp: int = 0
    phys_flushed_offset: int = 0
    logics_flushed_offset: int = 0

    @classmethod
    def load(cls, path: Path) -> Checkpoint | None:
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        if len(raw) < _LAYOUT.size:
            return None
        return cls(*_LAYOUT.unpack_from(raw))

    def save(self, path: Path) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size != FILE_SIZE:
                os.ftruncate(fd, FILE_SIZE)
            os.pwrite(fd, _LAYOUT.pack(*dataclasses.astuple(self)), 0)
            os.fdatasync(fd)
        finally:
            os.close(fd)
