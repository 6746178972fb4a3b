"""Queue allocation strategies of a clustering consumer group, after RocketMQ's client.

Every consumer of a group runs the same pure function on its own view: `mq_all` from the
route it got from *one* name server, `cid_all` from a broker. Both are sorted first
(RebalanceImpl.rebalanceByTopic), so consumers with equal views agree; consumers with
different views may both take a queue.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True, order=True)
class MessageQueue:
    """A queue of a topic on one broker group; ordered by topic, broker, queue id as in Java."""

    topic: str
    broker: str
    queue_id: int

    def __str__(self) -> str:
        # MessageQueue.toString(): the key CONSISTENT_HASH hashes.
        return (
            f"MessageQueue [topic={self.topic}, brokerName={self.broker}, queueId={self.queue_id}]"
        )


class Strategy(StrEnum):
    AVG = "AVG"
    AVG_BY_CIRCLE = "AVG_BY_CIRCLE"
    CONSISTENT_HASH = "CONSISTENT_HASH"
    MACHINE_ROOM = "MACHINE_ROOM"


Allocate = Callable[[str, str, Sequence[MessageQueue], Sequence[str]], list[MessageQueue]]


def _prepare(
    current_cid: str, mq_all: Iterable[MessageQueue], cid_all: Iterable[str]
) -> tuple[list[MessageQueue], list[str]] | None:
    """Sorted, de-duplicated inputs; None when `current_cid` is not in the group (no queues)."""
    if not current_cid:
        raise ValueError("current_cid is empty")
    mqs = sorted(set(mq_all))
    cids = sorted(set(cid_all))
    if not mqs:
        raise ValueError("mq_all is empty")
    if not cids:
        raise ValueError("cid_all is empty")
    if current_cid not in cids:
        return None
    return mqs, cids


def allocate_averagely(
    group: str, current_cid: str, mq_all: Sequence[MessageQueue], cid_all: Sequence[str]
) -> list[MessageQueue]:
    """AVG: consecutive blocks; the first `len(mq) % len(cid)` consumers get one more."""
    prepared = _prepare(current_cid, mq_all, cid_all)
    if prepared is None:
        return []
    mqs, cids = prepared
    index, n_mq, n_cid = cids.index(current_cid), len(mqs), len(cids)
    mod = n_mq % n_cid
    if n_mq <= n_cid:
        size = 1
    else:
        size = n_mq // n_cid + (1 if mod > 0 and index < mod else 0)
    start = index * size if mod > 0 and index < mod else index * size + mod
    count = min(size, n_mq - start)
    return [mqs[(start + i) % n_mq] for i in range(count)]


def allocate_averagely_by_circle(
    group: str, current_cid: str, mq_all: Sequence[MessageQueue], cid_all: Sequence[str]
) -> list[MessageQueue]:
    """AVG_BY_CIRCLE: deal queues round the consumers like cards."""
    prepared = _prepare(current_cid, mq_all, cid_all)
    if prepared is None:
        return []
    mqs, cids = prepared
    index = cids.index(current_cid)
    return mqs[index :: len(cids)]


def md5_hash(key: str) -> int:
    """ConsistentHashRouter.MD5Hash: the first 4 digest bytes as an unsigned 32-bit number."""
    return int.from_bytes(hashlib.md5(key.encode()).digest()[:4], "big")


class HashRing:
    """ConsistentHashRouter: `virtual_nodes` points `"{cid}-{i}"` per consumer on an MD5 ring."""

    def __init__(self, nodes: Iterable[str], virtual_nodes: int = 10) -> None:
        if virtual_nodes < 0:
            raise ValueError(f"virtual_nodes must be >= 0, got {virtual_nodes}")
        ring: dict[int, str] = {}
        for node in nodes:
            for i in range(virtual_nodes):
                # On a collision the later point wins, as with TreeMap.put.
                ring[md5_hash(f"{node}-{i}")] = node
        self._points = sorted(ring)
        self._owners = [ring[p] for p in self._points]

    def route(self, key: str) -> str | None:
        """The node owning the first point at or after hash(key), wrapping round; None if empty."""
        if not self._points:
            return None
        i = bisect.bisect_left(self._points, md5_hash(key))
        return self._owners[i % len(self._points)]


def consistent_hash(virtual_nodes: int = 10) -> Allocate:
    """CONSISTENT_HASH with `virtual_nodes` per consumer (RocketMQ's default is 10)."""

    def allocate(
        group: str, current_cid: str, mq_all: Sequence[MessageQueue], cid_all: Sequence[str]
    ) -> list[MessageQueue]:
        prepared = _prepare(current_cid, mq_all, cid_all)
        if prepared is None:
            return []
        mqs, cids = prepared
        ring = HashRing(cids, virtual_nodes)
        return [mq for mq in mqs if ring.route(str(mq)) == current_cid]

    return allocate


def machine_room_of_broker(broker: str) -> str | None:
    """The room a broker is in, named `room@broker` (AllocateMessageQueueByMachineRoom)."""
    room, sep, _ = broker.partition("@")
    return room if sep and room else None


def machine_room_nearby(
    broker_room: Mapping[str, str] | Callable[[MessageQueue], str],
    consumer_room: Mapping[str, str] | Callable[[str], str],
    inner: Allocate = allocate_averagely,
) -> Allocate:
    """MACHINE_ROOM (AllocateMachineRoomNearby): a room's queues go to that room's consumers.

    Queues of a room with no live consumer are shared by all consumers through `inner`.
    Rooms are looked up by broker name / client id, or by the callables given.
    """

    def room_of_mq(mq: MessageQueue) -> str:
        room = broker_room(mq) if callable(broker_room) else broker_room.get(mq.broker)
        if not room:
            raise ValueError(f"machine room unknown for {mq}")
        return room

    def room_of_cid(cid: str) -> str:
        room = consumer_room(cid) if callable(consumer_room) else consumer_room.get(cid)
        if not room:
            raise ValueError(f"machine room unknown for consumer {cid}")
        return room

    def allocate(
        group: str, current_cid: str, mq_all: Sequence[MessageQueue], cid_all: Sequence[str]
    ) -> list[MessageQueue]:
        prepared = _prepare(current_cid, mq_all, cid_all)
        if prepared is None:
            return []
        mqs, cids = prepared
        mq_by_room: dict[str, list[MessageQueue]] = {}
        for mq in mqs:
            mq_by_room.setdefault(room_of_mq(mq), []).append(mq)
        cid_by_room: dict[str, list[str]] = {}
        for cid in cids:
            cid_by_room.setdefault(room_of_cid(cid), []).append(cid)
        here = room_of_cid(current_cid)
        result = []
        if mq_by_room.get(here):
            result += inner(group, current_cid, mq_by_room[here], cid_by_room[here])
        for room in sorted(mq_by_room):
            if room != here and room not in cid_by_room:
                result += inner(group, current_cid, mq_by_room[room], cids)
        return result

    return allocate


def machine_room_of_names(inner: Allocate = allocate_averagely) -> Allocate:
    """MACHINE_ROOM with rooms read from the names: broker `room@name`, client id `room@id`."""

    def broker_room(mq: MessageQueue) -> str:
        return machine_room_of_broker(mq.broker) or ""

    def consumer_room(cid: str) -> str:
        return machine_room_of_broker(cid) or ""

    return machine_room_nearby(broker_room, consumer_room, inner)


def allocate_by_machine_room(consumer_rooms: Iterable[str]) -> Allocate:
    """RocketMQ's AllocateMessageQueueByMachineRoom: only queues of brokers named `room@name`
    with a room in `consumer_rooms`, in blocks, the remainder one each from the first consumer.
    """
    rooms = frozenset(consumer_rooms)

    def allocate(
        group: str, current_cid: str, mq_all: Sequence[MessageQueue], cid_all: Sequence[str]
    ) -> list[MessageQueue]:
        prepared = _prepare(current_cid, mq_all, cid_all)
        if prepared is None:
            return []
        mqs, cids = prepared
        index = cids.index(current_cid)
        mine = [mq for mq in mqs if machine_room_of_broker(mq.broker) in rooms]
        block, rem = divmod(len(mine), len(cids))
        result = mine[index * block : (index + 1) * block]
        if rem > index:
            result.append(mine[index + block * len(cids)])
        return result

    return allocate


def strategy(name: Strategy | str, virtual_nodes: int = 10) -> Allocate:
    """The allocate function a consumer configured with `name` uses.

    MACHINE_ROOM reads rooms from `room@...` broker names and client ids; use
    `machine_room_nearby` directly to give them as tables.
    """
    match Strategy(name):
        case Strategy.AVG:
            return allocate_averagely
        case Strategy.AVG_BY_CIRCLE:
            return allocate_averagely_by_circle
        case Strategy.CONSISTENT_HASH:
            return consistent_hash(virtual_nodes)
        case Strategy.MACHINE_ROOM:
            return machine_room_of_names()
