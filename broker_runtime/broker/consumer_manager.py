"""Which clients are in which consumer group (RocketMQ's ConsumerManager). No I/O.

Clients join and refresh by HEART_BEAT, leave by UNREGISTER_CLIENT, by closing their
connection, or by falling silent past the expiry. Every change of a group's members is
returned to the caller, which tells the group's clients (NOTIFY_CONSUMER_IDS_CHANGED).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from broker_runtime.remoting.bodies import ConsumerData, SubscriptionData


@dataclass(slots=True)
class ClientChannel:
    client_id: str
    conn: Hashable
    last_update_ms: int
    language: str = "OTHER"  # the heartbeat's LanguageCode and version (ClientChannelInfo)
    version: int = 0


@dataclass(slots=True)
class ConsumerGroupInfo:
    group: str
    consume_type: str = "CONSUME_PASSIVELY"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    subscriptions: dict[str, SubscriptionData] = field(default_factory=dict)  # by topic
    channels: dict[str, ClientChannel] = field(default_factory=dict)


class ConsumerManager:
    def __init__(self) -> None:
        self.groups: dict[str, ConsumerGroupInfo] = {}

    def register(
        self,
        client_id: str,
        conn: Hashable,
        data: ConsumerData,
        now_ms: int,
        language: str = "OTHER",
        version: int = 0,
    ) -> bool:
        """A heartbeat from `client_id`; True if the group's members or subscriptions changed."""
        info = self.groups.get(data.group_name)
        if info is None:
            info = self.groups[data.group_name] = ConsumerGroupInfo(data.group_name)
        info.consume_type = data.consume_type
        info.message_model = data.message_model
        info.consume_from_where = data.consume_from_where
        old = info.channels.get(client_id)
        info.channels[client_id] = ClientChannel(client_id, conn, now_ms, language, version)
        subs = {s.topic: s for s in data.subscriptions}
        changed = old is None or old.conn is not conn or subs != info.subscriptions
        info.subscriptions = subs
        return changed

    def unregister(self, client_id: str, group: str) -> bool:
        info = self.groups.get(group)
        if info is None or info.channels.pop(client_id, None) is None:
            return False
        self._drop_if_empty(group)
        return True

    def connection_closed(self, conn: Hashable) -> list[str]:
        """Remove the clients of a closed connection; returns the groups that changed."""
        return self._remove(lambda ch: ch.conn is conn)

    def expire(self, now_ms: int, expiry_ms: int) -> list[str]:
        """Remove clients silent for longer than `expiry_ms`; returns the groups that changed."""
        return self._remove(lambda ch: now_ms - ch.last_update_ms > expiry_ms)

    def _remove(self, gone: Callable[[ClientChannel], bool]) -> list[str]:
        changed = []
        for group, info in list(self.groups.items()):
            stale = [cid for cid, ch in info.channels.items() if gone(ch)]
            for cid in stale:
                del info.channels[cid]
            if stale:
                changed.append(group)
                self._drop_if_empty(group)
        return changed

    def _drop_if_empty(self, group: str) -> None:
        if not self.groups[group].channels:
            del self.groups[group]

    def client_ids(self, group: str) -> list[str]:
        info = self.groups.get(group)
        return sorted(info.channels) if info else []

    def groups_of_topic(self, topic: str) -> set[str]:
        """The groups subscribed to `topic` (queryTopicConsumeByWho)."""
        return {g for g, info in self.groups.items() if topic in info.subscriptions}

    def connections(self, group: str) -> list[Hashable]:
        info = self.groups.get(group)
        return [ch.conn for ch in info.channels.values()] if info else []
