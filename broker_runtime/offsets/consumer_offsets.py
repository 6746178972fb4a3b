"""Committed consumer offsets per `topic@group` and queue: `config/consumerOffset.json`.

The file has RocketMQ's shape, `{"offsetTable": {"topic@group": {"0": 33, ...}}}`.
"""

from __future__ import annotations

import threading
from pathlib import Path

from broker_runtime.common.topics import validate_group, validate_topic
from broker_runtime.offsets.json_file import CorruptStateError, read_with_backup, write_atomic

TOPIC_GROUP_SEPARATOR = "@"


class ConsumerOffsets:
    def __init__(self, store_dir: Path) -> None:
        self.path = Path(store_dir) / "config" / "consumerOffset.json"
        self._lock = threading.Lock()
        # One writer at a time: persists from the periodic task and from a slave's sync run
        # on executor threads and would race on the one `.tmp` file.
        self._write_lock = threading.Lock()
        self._table: dict[str, dict[int, int]] = {}
        data = read_with_backup(self.path)
        if data is not None:
            try:
                table = data["offsetTable"]
                self._table = {
                    key: {int(q): int(o) for q, o in queues.items()}
                    for key, queues in table.items()
                }
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise CorruptStateError(f"{self.path} is not an offsetTable: {e}") from e

    @staticmethod
    def key(topic: str, group: str) -> str:
        return f"{validate_topic(topic)}{TOPIC_GROUP_SEPARATOR}{validate_group(group)}"

    def commit(self, topic: str, group: str, queue_id: int, offset: int) -> None:
        if offset < 0 or queue_id < 0:
            raise ValueError(f"queue {queue_id} offset {offset}: both must be >= 0")
        with self._lock:
            self._table.setdefault(self.key(topic, group), {})[queue_id] = offset

    def query(self, topic: str, group: str, queue_id: int) -> int:
        """The committed offset, or -1 when the group never committed for this queue."""
        with self._lock:
            return self._table.get(self.key(topic, group), {}).get(queue_id, -1)

    def table(self) -> dict[str, dict[int, int]]:
        with self._lock:
            return {k: dict(v) for k, v in self._table.items()}

    def persist(self) -> None:
        with self._write_lock:
            with self._lock:
                snapshot = {
                    k: {str(q): o for q, o in sorted(v.items())}
                    for k, v in sorted(self._table.items())
                }
            write_atomic(self.path, {"offsetTable": snapshot})
