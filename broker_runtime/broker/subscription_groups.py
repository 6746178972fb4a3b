"""Consumer group settings, `config/subscriptionGroup.json` in RocketMQ's shape."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker_runtime.broker.topic_config import DataVersion
from broker_runtime.common.constants import MAX_RECONSUME_TIMES
from broker_runtime.common.topics import validate_group
from broker_runtime.offsets.json_file import CorruptStateError, read_with_backup, write_atomic


@dataclass(frozen=True, slots=True)
class SubscriptionGroupConfig:
    group_name: str
    consume_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = 1
    retry_max_times: int = MAX_RECONSUME_TIMES
    broker_id: int = 0  # where to pull from normally
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True

    def __post_init__(self) -> None:
        validate_group(self.group_name)

    def to_json(self) -> dict[str, Any]:
        return {
            "groupName": self.group_name,
            "consumeEnable": self.consume_enable,
            "consumeFromMinEnable": True,
            "consumeBroadcastEnable": self.consume_broadcast_enable,
            "retryQueueNums": self.retry_queue_nums,
            "retryMaxTimes": self.retry_max_times,
            "brokerId": self.broker_id,
            "whichBrokerWhenConsumeSlowly": self.which_broker_when_consume_slowly,
            "notifyConsumerIdsChangedEnable": self.notify_consumer_ids_changed_enable,
        }

    @classmethod
    def from_json(cls, raw: Any) -> SubscriptionGroupConfig:
        if not isinstance(raw, dict) or "groupName" not in raw:
            raise ValueError(f"subscription group config {raw!r} has no groupName")
        d = cls(str(raw["groupName"]))
        try:
            return cls(
                d.group_name,
                bool(raw.get("consumeEnable", d.consume_enable)),
                bool(raw.get("consumeBroadcastEnable", d.consume_broadcast_enable)),
                int(raw.get("retryQueueNums", d.retry_queue_nums)),
                int(raw.get("retryMaxTimes", d.retry_max_times)),
                int(raw.get("brokerId", d.broker_id)),
                int(raw.get("whichBrokerWhenConsumeSlowly", d.which_broker_when_consume_slowly)),
                bool(
                    raw.get("notifyConsumerIdsChangedEnable", d.notify_consumer_ids_changed_enable)
                ),
            )
        except (TypeError, ValueError) as e:
            raise ValueError(f"group {d.group_name!r} has a bad config: {e}") from None


class SubscriptionGroupManager:
    def __init__(
        self, store_dir: Path, auto_create: bool = True, retry_max_times: int = MAX_RECONSUME_TIMES
    ) -> None:
        self.path = Path(store_dir) / "config" / "subscriptionGroup.json"
        self.auto_create = auto_create
        self.retry_max_times = retry_max_times  # of groups created on first use
        self.table: dict[str, SubscriptionGroupConfig] = {}
        self.version = DataVersion()
        data = read_with_backup(self.path)
        if data is not None:
            try:
                self.table = self.parse_table(data.get("subscriptionGroupTable", {}))
                self.version = DataVersion.from_json(data.get("dataVersion"))
            except (ValueError, AttributeError) as e:
                raise CorruptStateError(f"{self.path}: {e}") from e

    @staticmethod
    def parse_table(raw: Any) -> dict[str, SubscriptionGroupConfig]:
        if not isinstance(raw, dict):
            raise ValueError("subscriptionGroupTable is not an object")
        return {name: SubscriptionGroupConfig.from_json(cfg) for name, cfg in raw.items()}

    def find(self, group: str) -> SubscriptionGroupConfig | None:
        """The group's config; created with defaults if auto-create is on."""
        cfg = self.table.get(group)
        if cfg is None and self.auto_create:
            cfg = SubscriptionGroupConfig(group, retry_max_times=self.retry_max_times)
            self.put(cfg)
        return cfg

    def put(self, cfg: SubscriptionGroupConfig) -> None:
        self.table[cfg.group_name] = cfg
        self.version.bump()
        self.persist()

    def replace_all(self, table: dict[str, SubscriptionGroupConfig]) -> None:
        if table != self.table:
            self.table = dict(table)
            self.version.bump()
            self.persist()

    def to_json(self) -> dict[str, Any]:
        return {
            "subscriptionGroupTable": {n: c.to_json() for n, c in sorted(self.table.items())},
            "dataVersion": self.version.to_json(),
        }

    def persist(self) -> None:
        write_atomic(self.path, self.to_json())
