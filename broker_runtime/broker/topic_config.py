"""The broker's topics, `config/topics.json` in RocketMQ's TopicConfigSerializeWrapper shape.

{"topicConfigTable": {"T": {"topicName": "T", "readQueueNums": 4, "writeQueueNums": 4,
"perm": 6, "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": false}},
"dataVersion": {"timestamp": ms, "counter": n}}, written atomically with a `.bak`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker_runtime.common.topics import validate_topic
from broker_runtime.offsets.json_file import CorruptStateError, read_with_backup, write_atomic
from broker_runtime.remoting.bodies import PERM_READ, PERM_WRITE

PERM_RW = PERM_READ | PERM_WRITE
MAX_QUEUES = 1024  # read or write queues of one topic


@dataclass(frozen=True, slots=True)
class TopicConfig:
    topic_name: str
    read_queue_nums: int = 4
    write_queue_nums: int = 4
    perm: int = PERM_RW
    order: bool = False

    def __post_init__(self) -> None:
        validate_topic(self.topic_name)
        for n in (self.read_queue_nums, self.write_queue_nums):
            if not 0 < n <= MAX_QUEUES:
                raise ValueError(
                    f"topic {self.topic_name}: queue count {n} outside 1..{MAX_QUEUES}"
                )
        if self.perm & ~(PERM_RW | 1) or self.perm < 0:
            raise ValueError(f"topic {self.topic_name}: perm {self.perm} is not 0..7")

    @property
    def writable(self) -> bool:
        return bool(self.perm & PERM_WRITE)

    @property
    def readable(self) -> bool:
        return bool(self.perm & PERM_READ)

    def to_json(self) -> dict[str, Any]:
        return {
            "topicName": self.topic_name,
            "readQueueNums": self.read_queue_nums,
            "writeQueueNums": self.write_queue_nums,
            "perm": self.perm,
            "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": 0,
            "order": self.order,
        }

    @classmethod
    def from_json(cls, name: str, raw: Any) -> TopicConfig:
        try:
            return cls(
                name,
                int(raw["readQueueNums"]),
                int(raw["writeQueueNums"]),
                int(raw.get("perm", PERM_RW)),
                bool(raw.get("order", False)),
            )
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"topic {name!r} has a bad config: {e!r}") from None


class DataVersion:
    """RocketMQ's DataVersion: bumped on every change, so peers can tell a table moved."""

    def __init__(self, timestamp: int = 0, counter: int = 0) -> None:
        self.timestamp, self.counter = timestamp, counter

    def bump(self) -> None:
        self.timestamp, self.counter = int(time.time() * 1000), self.counter + 1

    def to_json(self) -> dict[str, int]:
        return {"timestamp": self.timestamp, "counter": self.counter}

    @classmethod
    def from_json(cls, raw: Any) -> DataVersion:
        if not isinstance(raw, dict):
            return cls()
        return cls(int(raw.get("timestamp", 0)), int(raw.get("counter", 0)))


class TopicConfigManager:
    def __init__(self, store_dir: Path) -> None:
        self.path = Path(store_dir) / "config" / "topics.json"
        self.table: dict[str, TopicConfig] = {}
        self.version = DataVersion()
        data = read_with_backup(self.path)
        if data is not None:
            try:
                self.table = self.parse_table(data.get("topicConfigTable", {}))
                self.version = DataVersion.from_json(data.get("dataVersion"))
            except (ValueError, AttributeError) as e:
                raise CorruptStateError(f"{self.path}: {e}") from e

    @staticmethod
    def parse_table(raw: Any) -> dict[str, TopicConfig]:
        if not isinstance(raw, dict):
            raise ValueError("topicConfigTable is not an object")
        return {name: TopicConfig.from_json(name, cfg) for name, cfg in raw.items()}

    def get(self, topic: str) -> TopicConfig | None:
        return self.table.get(topic)

    def add_system(self, cfg: TopicConfig) -> None:
        """A topic the broker always has (RocketMQ's TopicConfigManager constructor): kept when
        topics.json holds it already, not written until the table is."""
        self.table.setdefault(cfg.topic_name, cfg)

    def put(self, cfg: TopicConfig) -> None:
        """Create or update a topic and persist the table."""
        self.table[cfg.topic_name] = cfg
        self.version.bump()
        self.persist()

    def replace_all(self, table: dict[str, TopicConfig]) -> None:
        """A slave takes its master's table (SlaveSynchronize)."""
        if table != self.table:
            self.table = dict(table)
            self.version.bump()
            self.persist()

    def to_json(self) -> dict[str, Any]:
        return {
            "topicConfigTable": {n: c.to_json() for n, c in sorted(self.table.items())},
            "dataVersion": self.version.to_json(),
        }

    def persist(self) -> None:
        write_atomic(self.path, self.to_json())
