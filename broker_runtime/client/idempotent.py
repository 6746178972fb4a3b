"""Idempotent consumption: duplicate deliveries of a message run its effect once.

Wraps a per-message consume callback (the de-dup table). Before the
callback runs, the message is claimed CONSUMING for `hold_ms`; success marks it CONSUMED,
failure (the callback's "later" status or an exception) releases the claim so a redelivery
runs it again. A redelivery of a CONSUMED message is acknowledged without running the
callback; one that arrives while another consumer holds the claim is sent back for later.
A consumer that dies mid-effect holds the claim until it expires, then the next delivery
takes it over. What this cannot prevent: an effect whose CONSUMED mark is lost (the store
fails after the effect) runs again once the claim expires; make `hold_ms` longer than the
slowest callback, or the claim expires under a live one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from broker_runtime.common.clock import Clock, SystemClock
from broker_runtime.common.topics import validate_group
from broker_runtime.ledger.dedup import Claim, DedupStore, SqlDedupStore
from broker_runtime.ledger.redis_dedup import RedisDedupStore

DEFAULT_HOLD_MS = 60_000


class Keyed(Protocol):
    @property
    def uniq_key(self) -> str | None: ...

    @property
    def msg_id(self) -> str: ...


M = TypeVar("M", bound=Keyed)
S = TypeVar("S")


def message_key(msg: Keyed) -> str:
    """UNIQ_KEY, the id a producer resend keeps; the offset id for a message without one."""
    return msg.uniq_key or msg.msg_id


@dataclass
class IdempotenceStats:
    ran: int = 0  # the callback ran (whatever it returned)
    skipped: int = 0  # already CONSUMED: acknowledged without running
    deferred: int = 0  # held by someone else: asked to come back later


class Idempotent(Generic[M, S]):
    """`Idempotent(callback, store, group, success=OK, later=LATER)` is a callback itself.

    `success` and `later` are the consumer's own status values (CONSUME_SUCCESS and
    RECONSUME_LATER); any other result or an exception counts as a failure.
    """

    def __init__(
        self,
        callback: Callable[[M], S],
        store: DedupStore,
        group: str,
        *,
        success: S,
        later: S,
        hold_ms: int = DEFAULT_HOLD_MS,
        clock: Clock | None = None,
        key: Callable[[M], str] = message_key,
    ) -> None:
        if hold_ms <= 0:
            raise ValueError(f"hold_ms must be > 0, got {hold_ms}")
        self.callback = callback
        self.store = store
        self.group = validate_group(group)
        self.success = success
        self.later = later
        self.hold_ms = hold_ms
        self.clock = clock or SystemClock()
        self.key = key
        self.stats = IdempotenceStats()
        self._lock = threading.Lock()

    def __call__(self, msg: M) -> S:
        key = self.key(msg)
        claim = self.store.claim(self.group, key, self.clock.now_ms(), self.hold_ms)
        if claim is Claim.CONSUMED:
            self._count("skipped")
            return self.success
        if claim is Claim.IN_PROGRESS:
            self._count("deferred")
            return self.later
        self._count("ran")
        try:
            result = self.callback(msg)
        except BaseException:
            self.store.release(self.group, key)
            raise
        if result == self.success:
            self.store.finish(self.group, key, self.clock.now_ms())
        else:
            self.store.release(self.group, key)
        return result

    def _count(self, field: str) -> None:
        with self._lock:
            setattr(self.stats, field, getattr(self.stats, field) + 1)


def open_dedup_store(
    data_dir: Path | None, url: str | None = None, redis_url: str | None = None
) -> DedupStore:
    """Redis when `redis_url` is given, else the consumer ledger database (file or `url`)."""
    if redis_url:
        return RedisDedupStore.from_url(redis_url)
    return SqlDedupStore.open(data_dir, url)
