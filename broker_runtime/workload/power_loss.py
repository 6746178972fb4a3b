"""A broker machine losing power, on the store files it leaves behind.

A SIGKILL loses nothing the process wrote: the kernel still has it in the page cache and
writes it out. A power cut also loses what was written but not yet fsynced. So after the
kill, the commitlog is cut back to the last fsync: every byte past it reads as zero again,
as in a file whose tail never reached the disk. The consume queues and the index are left
for the broker's recovery to bring back in line, as after a real power cut.

Where the last fsync was: the checkpoint records the flushed log offset each time it is
written. With `flush_interval_ms` equal to `cq_flush_interval_ms` the store's background
thread writes the checkpoint right after each ASYNC_FLUSH flush, so it names the last
fsync (give or take a kill between the two). Under SYNC_FLUSH a put is answered only after
its fsync, so the end of every answered message is a lower bound too.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from broker_runtime.store.checkpoint import Checkpoint


def commitlog_dir(store_dir: Path) -> Path:
    return Path(store_dir) / "commitlog"


def checkpoint_flushed(store_dir: Path) -> int:
    """The flushed log offset in the store's checkpoint (0 when there is none)."""
    cp = Checkpoint.load(Path(store_dir) / "checkpoint")
    return cp.phys_flushed_offset if cp is not None else 0


def unit_end(store_dir: Path, phys_offset: int) -> int:
    """The log offset just past the message stored at `phys_offset` (its TOTALSIZE read)."""
    for path in sorted(commitlog_dir(store_dir).iterdir()):
        start, size = int(path.name), path.stat().st_size
        if start <= phys_offset < start + size:
            with open(path, "rb") as f:
                f.seek(phys_offset - start)
                total = int.from_bytes(f.read(4), "big", signed=True)
            if total <= 0:
                raise ValueError(f"no message at log offset {phys_offset} in {store_dir}")
            return phys_offset + total
    raise ValueError(f"log offset {phys_offset} is in no segment of {store_dir}")


def last_fsync(store_dir: Path, answered: Iterable[int] = ()) -> int:
    """The last fsync point: the checkpoint's, or past the last of `answered` (log offsets
    of messages put under SYNC_FLUSH and answered), whichever is further."""
    ends = [unit_end(store_dir, off) for off in answered]
    return max([checkpoint_flushed(store_dir), *ends])


def cut_commitlog(store_dir: Path, offset: int) -> None:
    """Zero the log from `offset` on; the segment files keep their size."""
    for path in sorted(commitlog_dir(store_dir).iterdir()):
        start, size = int(path.name), path.stat().st_size
        if start + size <= offset:
            continue
        with open(path, "r+b") as f:  # truncate, then grow back: the tail is a hole of zeros
            f.truncate(max(0, offset - start))
            f.truncate(size)
            os.fsync(f.fileno())
