"""Small JSON state files written atomically, with a `.bak` of the previous version.

As RocketMQ's ConfigManager: write `name.tmp`, fsync, keep the old file as `name.bak`,
rename the new one into place, fsync the directory. A reader falls back to `.bak` when the
main file is missing or unreadable (a crash between the two renames). Reads what Apache
RocketMQ's broker writes too (fastjson: integer keys unquoted, see common.fastjson).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from broker_runtime.common import fastjson


class CorruptStateError(ValueError):
    """Neither the file nor its `.bak` holds valid JSON."""


def write_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=2, sort_keys=True).encode()
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    if path.exists():
        os.replace(path, path.with_name(path.name + ".bak"))
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_with_backup(path: Path) -> Any | None:
    """The JSON in `path`, else in `path.bak`; None if neither exists."""
    bak = path.with_name(path.name + ".bak")
    errors = []
    for candidate in (path, bak):
        try:
            return fastjson.loads(candidate.read_text())
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as e:
            errors.append(f"{candidate.name}: {e}")
    if errors:
        raise CorruptStateError(f"cannot read {path}: {'; '.join(errors)}")
    return None
