"""An ordered run of equal-size segment files in one directory: a log addressed by offset."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from broker_runtime.store.mapped_file import NAME_DIGITS, MappedFile, segment_name

_SEGMENT_NAME = re.compile(rf"\d{{{NAME_DIGITS}}}")


class SegmentQueue:
    def __init__(
        self, directory: Path, file_size: int, *, readonly: bool = False, reserve_ahead: int = 0
    ) -> None:
        """`reserve_ahead`: see MappedFile (the CommitLog's segments reserve disk ahead)."""
        self.directory = directory
        self.file_size = file_size
        self.reserve_ahead = reserve_ahead
        self.files: list[MappedFile] = []
        if directory.is_dir():
            names = sorted(p.name for p in directory.iterdir() if _SEGMENT_NAME.fullmatch(p.name))
            for name in names:
                self.files.append(
                    MappedFile(
                        directory / name, file_size, readonly=readonly, reserve_ahead=reserve_ahead
                    )
                )
            for prev, nxt in zip(self.files, self.files[1:], strict=False):
                if nxt.file_from_offset != prev.file_from_offset + file_size:
                    raise ValueError(
                        f"{directory}: segment {nxt.path.name} does not follow {prev.path.name}"
                    )
        for f in self.files:  # until recovery says otherwise, every loaded file is full
            f.wrote_position = f.flushed_position = file_size

    @property
    def min_offset(self) -> int:
        return self.files[0].file_from_offset if self.files else 0

    @property
    def max_offset(self) -> int:
        """Offset just past the last written byte."""
        return self.files[-1].end_offset if self.files else 0

    @property
    def flushed_offset(self) -> int:
        """End of the longest prefix of the queue that is on disk (every file, not the last)."""
        for f in self.files:
            if f.flushed_position < self.file_size:
                return f.file_from_offset + f.flushed_position
        return self.max_offset

    def last_file(self, start_offset: int = 0) -> MappedFile:
        """The file to append to, rolling to a new one when the last is full."""
        if self.files and not self.files[-1].is_full():
            return self.files[-1]
        if self.files:
            start = self.files[-1].file_from_offset + self.file_size
        else:
            start = start_offset - start_offset % self.file_size
        self.directory.mkdir(parents=True, exist_ok=True)
        f = MappedFile(
            self.directory / segment_name(start), self.file_size, reserve_ahead=self.reserve_ahead
        )
        self.files.append(f)
        return f

    def find(self, offset: int) -> MappedFile | None:
        """The file holding `offset`, or None if it lies outside the queue."""
        if not self.files or offset < self.min_offset or offset >= self.max_offset:
            return None
        files = self.files
        index = (offset - self.min_offset) // self.file_size
        if not 0 <= index < len(files):
            return None
        f = files[index]
        # Cleanup may drop the first file between the two reads above (readers take no lock).
        return f if f.file_from_offset <= offset < f.file_from_offset + self.file_size else None

    def flush(self) -> int:
        """fdatasync every file written since the last flush; returns the flushed offset."""
        for f in self.files:
            if f.wrote_position > f.flushed_position:
                f.flush()
        return self.flushed_offset

    def truncate(self, offset: int) -> list[MappedFile]:
        """Make `offset` the end of the queue: later files are removed and returned closed.

        The caller decides what to do with the bytes of the file holding `offset`
        (the CommitLog zeroes them after saving a copy).
        """
        removed = []
        while self.files and self.files[-1].file_from_offset > offset:
            f = self.files.pop()
            f.destroy()
            removed.append(f)
        if self.files and offset < self.max_offset:
            last = self.files[-1]
            last.wrote_position = offset - last.file_from_offset
            last.flushed_position = min(last.flushed_position, last.wrote_position)
        return removed

    def delete_files(self, predicate: Callable[[MappedFile], bool], keep_last: bool = True) -> int:
        """Delete leading files while `predicate` holds; never the last one if `keep_last`."""
        deleted = 0
        limit = len(self.files) - (1 if keep_last else 0)
        while deleted < limit and predicate(self.files[0]):
            self.files.pop(0).destroy()
            deleted += 1
        return deleted

    def close(self) -> None:
        for f in self.files:
            f.close()
