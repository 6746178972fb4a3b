"""The name server's tables, as RocketMQ's RouteInfoManager keeps them. No I/O.

topic -> broker name -> QueueData; broker name -> BrokerData (cluster, brokerId -> address);
cluster -> broker names; broker address -> liveness (last heartbeat, HA address, the
connection it registered on). Only a master's registration carries its topics into the
route; a broker group disappears from routes only when its last address is gone, so a slave
keeps serving reads for its group while the master is down.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from broker_runtime.remoting.bodies import MASTER_ID, BrokerData, QueueData, TopicRouteData


@dataclass(slots=True)
class BrokerLive:
    last_update_ms: int
    ha_server_addr: str
    channel: Hashable | None


@dataclass(frozen=True, slots=True)
class TopicQueues:
    """A master's topic config as registration carries it."""

    read_queue_nums: int
    write_queue_nums: int
    perm: int


class RouteTable:
    def __init__(self) -> None:
        self.topic_queues: dict[str, dict[str, QueueData]] = {}
        self.brokers: dict[str, BrokerData] = {}
        self.clusters: dict[str, set[str]] = {}
        self.live: dict[str, BrokerLive] = {}

    def register(
        self,
        cluster: str,
        broker_addr: str,
        broker_name: str,
        broker_id: int,
        ha_server_addr: str,
        topics: dict[str, TopicQueues] | None,
        now_ms: int,
        channel: Hashable | None = None,
    ) -> tuple[str | None, str | None]:
        """Record a registration (or a heartbeat); returns (master address, master HA address)."""
        self.clusters.setdefault(cluster, set()).add(broker_name)
        data = self.brokers.get(broker_name)
        if data is None:
            data = self.brokers[broker_name] = BrokerData(cluster, broker_name, {})
        # One address holds one id: a slave turned master must not stay listed as a slave.
        for other_id, addr in list(data.broker_addrs.items()):
            if addr == broker_addr and other_id != broker_id:
                del data.broker_addrs[other_id]
        data.broker_addrs[broker_id] = broker_addr
        if broker_id == MASTER_ID and topics is not None:
            for topic, q in topics.items():
                self.topic_queues.setdefault(topic, {})[broker_name] = QueueData(
                    broker_name, q.read_queue_nums, q.write_queue_nums, q.perm
                )
        self.live[broker_addr] = BrokerLive(now_ms, ha_server_addr, channel)
        if broker_id == MASTER_ID:
            return None, None
        master = data.broker_addrs.get(MASTER_ID)
        live = self.live.get(master) if master else None
        return master, live.ha_server_addr if live else None

    def unregister(self, broker_addr: str, broker_name: str, broker_id: int) -> bool:
        """Drop one broker (a clean shutdown); False if it was not registered."""
        data = self.brokers.get(broker_name)
        known = data is not None and data.broker_addrs.get(broker_id) == broker_addr
        if known:
            self._remove(broker_addr)
        return known

    def _remove(self, broker_addr: str) -> None:
        self.live.pop(broker_addr, None)
        for name, data in list(self.brokers.items()):
            for bid, addr in list(data.broker_addrs.items()):
                if addr == broker_addr:
                    del data.broker_addrs[bid]
            if not data.broker_addrs:  # the group's last broker: its queues leave the routes
                del self.brokers[name]
                names = self.clusters.get(data.cluster)
                if names is not None:
                    names.discard(name)
                    if not names:
                        del self.clusters[data.cluster]
                for topic, queues in list(self.topic_queues.items()):
                    queues.pop(name, None)
                    if not queues:
                        del self.topic_queues[topic]

    def expire(self, now_ms: int, expiry_ms: int) -> list[str]:
        """Drop brokers silent for longer than `expiry_ms`; returns their addresses."""
        gone = [a for a, b in self.live.items() if now_ms - b.last_update_ms > expiry_ms]
        for addr in gone:
            self._remove(addr)
        return gone

    def channel_closed(self, channel: Hashable) -> list[str]:
        """A broker's connection closed (BrokerHousekeepingService): drop what it registered."""
        gone = [a for a, b in self.live.items() if b.channel is channel]
        for addr in gone:
            self._remove(addr)
        return gone

    def route(self, topic: str) -> TopicRouteData | None:
        """pickupTopicRouteData: None when no live group serves the topic."""
        queues = self.topic_queues.get(topic)
        if not queues:
            return None
        brokers = [
            BrokerData(d.cluster, d.broker_name, dict(d.broker_addrs))
            for name in sorted(queues)
            if (d := self.brokers.get(name)) is not None
        ]
        if not brokers:
            return None
        return TopicRouteData([queues[n] for n in sorted(queues)], brokers)

    def cluster_info(self) -> dict[str, object]:
        """ClusterInfo: brokerAddrTable and clusterAddrTable."""
        return {
            "brokerAddrTable": {
                name: {
                    "cluster": d.cluster,
                    "brokerName": name,
                    "brokerAddrs": {str(k): v for k, v in sorted(d.broker_addrs.items())},
                }
                for name, d in sorted(self.brokers.items())
            },
            "clusterAddrTable": {c: sorted(n) for c, n in sorted(self.clusters.items())},
        }

    def topics(self) -> list[str]:
        return sorted(self.topic_queues)
