"""`STORE/config/delayOffset.json`: the schedule service's next offset per delay level."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from broker_runtime.offsets.json_file import CorruptStateError, read_with_backup, write_atomic

DELAY_OFFSET_FILE = Path("config") / "delayOffset.json"


def delay_offset_path(store_dir: Path) -> Path:
    return Path(store_dir) / DELAY_OFFSET_FILE


def read_delay_offsets(store_dir: Path) -> dict[int, int]:
    """Level -> next SCHEDULE_TOPIC_XXXX queue offset to deliver; {} when there is no file."""
    path = delay_offset_path(store_dir)
    data = read_with_backup(path)
    if data is None:
        return {}
    try:
        return {int(level): int(offset) for level, offset in data["offsetTable"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CorruptStateError(f"{path} is not a delay offsetTable: {e}") from e


def write_delay_offsets(store_dir: Path, table: Mapping[int, int]) -> None:
    """Write `{"offsetTable": {"1": 0, ...}}` atomically, keeping a `.bak`."""
    for level, offset in table.items():
        if level < 1 or offset < 0:
            raise ValueError(f"delay level {level} offset {offset}: level >= 1, offset >= 0")
    table_json = {str(level): int(table[level]) for level in sorted(table)}
    write_atomic(delay_offset_path(store_dir), {"offsetTable": table_json})
