"""The de-dup store in Redis: `SET key CONSUMING NX PX hold`, then `SET key CONSUMED PX long`.

Expiry is Redis's own: a hold whose consumer died disappears after `hold_ms`, and the next
delivery's `SET NX` takes it. Keys are `{prefix}:{group}:{msg_id}`.
"""

from __future__ import annotations

from typing import Any

import redis

from broker_runtime.ledger.dedup import DEFAULT_CONSUMED_TTL_MS, Claim
from broker_runtime.ledger.schema import DedupStatus

# Delete the key only while it still holds CONSUMING: a release must not erase CONSUMED.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class RedisDedupStore:
    def __init__(
        self,
        client: redis.Redis,
        *,
        consumed_ttl_ms: int = DEFAULT_CONSUMED_TTL_MS,
        prefix: str = "mqaudit:dedup",
    ) -> None:
        if consumed_ttl_ms <= 0:
            raise ValueError(f"consumed_ttl_ms must be > 0, got {consumed_ttl_ms}")
        self.client = client
        self.consumed_ttl_ms = consumed_ttl_ms
        self.prefix = prefix
        self._release = client.register_script(_RELEASE)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RedisDedupStore:
        """A store on the Redis at `url` (`redis://host:port/db`)."""
        return cls(redis.Redis.from_url(url, decode_responses=True), **options)

    def key(self, group: str, msg_id: str) -> str:
        return f"{self.prefix}:{group}:{msg_id}"

    def claim(self, group: str, msg_id: str, now_ms: int, hold_ms: int) -> Claim:
        """`now_ms` is unused: Redis times the hold itself."""
        if hold_ms <= 0:
            raise ValueError(f"hold_ms must be > 0, got {hold_ms}")
        key = self.key(group, msg_id)
        for _ in range(3):
            if self.client.set(key, DedupStatus.CONSUMING.value, nx=True, px=hold_ms):
                return Claim.ACQUIRED
            value = self._text(self.client.get(key))
            if value == DedupStatus.CONSUMED:
                return Claim.CONSUMED
            if value == DedupStatus.CONSUMING:
                return Claim.IN_PROGRESS
            # None: the hold expired or was released between SET and GET; try again.
        return Claim.IN_PROGRESS

    def finish(self, group: str, msg_id: str, now_ms: int) -> None:
        self.client.set(
            self.key(group, msg_id), DedupStatus.CONSUMED.value, px=self.consumed_ttl_ms
        )

    def release(self, group: str, msg_id: str) -> None:
        self._release(keys=[self.key(group, msg_id)], args=[DedupStatus.CONSUMING.value])

    def status(self, group: str, msg_id: str) -> DedupStatus | None:
        value = self._text(self.client.get(self.key(group, msg_id)))
        return None if value is None else DedupStatus(value)

    def close(self) -> None:
        self.client.close()

    @staticmethod
    def _text(value: Any) -> str | None:
        return value.decode() if isinstance(value, bytes) else value
