"""What a client makes of a topic route: queues to send to, queues to read, broker addresses.

Pure: built from a TopicRouteData (remoting/bodies.py) as RocketMQ's MQClientInstance
topicRouteData2TopicPublishInfo / topicRouteData2TopicSubscribeInfo do, plus the producer's
queue choice (TopicPublishInfo.selectOneMessageQueue with the broker that just failed left
out, and MQFaultStrategy's isolation of a failing broker for a while).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

from broker_runtime.client.rebalance import MessageQueue
from broker_runtime.remoting.bodies import MASTER_ID, PERM_READ, PERM_WRITE, TopicRouteData


def write_queues(topic: str, route: TopicRouteData) -> list[MessageQueue]:
    """Writable queues of brokers that have a master, by broker name then queue id."""
    masters = {b.broker_name for b in route.broker_datas if b.master_addr()}
    out = []
    for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
        if qd.perm & PERM_WRITE and qd.broker_name in masters:
            out += [MessageQueue(topic, qd.broker_name, i) for i in range(qd.write_queue_nums)]
    return out


def read_queues(topic: str, route: TopicRouteData) -> list[MessageQueue]:
    """Readable queues, whichever node of the broker group is alive (a slave serves reads)."""
    out = []
    for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
        if qd.perm & PERM_READ:
            out += [MessageQueue(topic, qd.broker_name, i) for i in range(qd.read_queue_nums)]
    return out


class FaultTable:
    """Brokers to keep away from until a time (MQFaultStrategy's LatencyFaultTolerance).

    A send that fails isolates its broker for `isolation_ms`; a success clears it.
    """

    def __init__(self, isolation_ms: int = 30_000) -> None:
        self.isolation_ms = isolation_ms
        self._until: dict[str, int] = {}

    def failed(self, broker: str, now_ms: int) -> None:
        self._until[broker] = now_ms + self.isolation_ms

    def succeeded(self, broker: str) -> None:
        self._until.pop(broker, None)

    def available(self, broker: str, now_ms: int) -> bool:
        until = self._until.get(broker)
        if until is None:
            return True
        if now_ms >= until:
            del self._until[broker]
            return True
        return False

    def isolated(self, now_ms: int) -> list[str]:
        return sorted(b for b in list(self._until) if not self.available(b, now_ms))


@dataclass
class PublishInfo:
    """A topic's writable queues and the round-robin position (TopicPublishInfo)."""

    queues: list[MessageQueue]
    _index: itertools.count[int] = field(default_factory=itertools.count, repr=False)

    def ok(self) -> bool:
        return bool(self.queues)

    def select(
        self, last_broker: str | None = None, faults: FaultTable | None = None, now_ms: int = 0
    ) -> MessageQueue:
        """The next queue round robin, skipping `last_broker` and isolated brokers if possible.

        Tries, in order: a queue on a broker that is neither `last_broker` nor isolated; one
        that is just not `last_broker`; any queue (a single broker still gets its retries).
        """
        n = len(self.queues)
        if n == 0:
            raise LookupError("no writable queue")
        start = next(self._index)
        queues = self.queues
        for i in range(n):
            mq = queues[(start + i) % n]
            if mq.broker != last_broker and (faults is None or faults.available(mq.broker, now_ms)):
                return mq
        for i in range(n):
            mq = queues[(start + i) % n]
            if mq.broker != last_broker:
                return mq
        return queues[start % n]


def broker_addrs(route: TopicRouteData) -> dict[str, dict[int, str]]:
    """brokerName -> {brokerId: address} of every broker the route names."""
    return {b.broker_name: dict(b.broker_addrs) for b in route.broker_datas}


def pick_read_addr(
    addrs: dict[int, str], suggested_id: int = MASTER_ID, down: Iterable[str] = ()
) -> tuple[int, str] | None:
    """The node to pull from: the suggested one, else the master, else any slave.

    Nodes in `down` (recent connection failures) are passed over while another is known,
    which is how a consumer keeps reading from the slave when the master is gone before the
    name servers notice (findBrokerAddressInSubscribe, plus that shortcut).
    """
    if not addrs:
        return None
    down = set(down)
    order = [suggested_id, MASTER_ID, *sorted(addrs)]
    for broker_id in order:
        addr = addrs.get(broker_id)
        if addr is not None and addr not in down:
            return broker_id, addr
    broker_id = suggested_id if suggested_id in addrs else min(addrs)
    return broker_id, addrs[broker_id]
