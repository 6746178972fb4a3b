"""Long polling (RocketMQ's PullRequestHoldService): a pull with nothing to read waits here.

The store's dispatcher thread reports each batch it indexed; the queues it touched wake
their waiting pulls on the event loop, which then read again. A pull registers itself in
the same loop step in which it found nothing, so an arrival cannot slip between the two.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from broker_runtime.store.record_codec import DispatchRequest

QueueKey = tuple[str, int]


class PullHoldService:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._waiters: dict[QueueKey, list[asyncio.Future[None]]] = {}

    def on_dispatched(self, batch: Sequence[DispatchRequest]) -> None:
        """Called from the dispatcher thread with what it just indexed."""
        if not self._waiters:
            return  # read off the loop: a waiter registering now re-checks (see `hold`)
        keys = {(r.topic, r.queue_id) for r in batch}
        self._loop.call_soon_threadsafe(self.wake, keys)

    def wake(self, keys: set[QueueKey] | None = None) -> None:
        """Wake the pulls waiting on `keys` (all of them when None)."""
        for key in list(self._waiters) if keys is None else keys:
            for fut in self._waiters.pop(key, ()):
                if not fut.done():
                    fut.set_result(None)

    async def hold(self, key: QueueKey, timeout: float, arrived: Callable[[], bool]) -> bool:
        """Wait until something is dispatched to `key` or `timeout` passes; True if woken.

        `arrived` is checked once more after registering: an arrival indexed between the
        caller's read and the registration is seen there instead of being waited out.
        """
        fut: asyncio.Future[None] = self._loop.create_future()
        waiters = self._waiters.setdefault(key, [])
        waiters.append(fut)
        try:
            if arrived():
                return True
            await asyncio.wait_for(fut, timeout)
            return True
        except TimeoutError:
            return False
        finally:
            if fut in waiters:
                waiters.remove(fut)
            if not waiters and self._waiters.get(key) is waiters:
                del self._waiters[key]

    @property
    def waiting(self) -> int:
        return sum(len(v) for v in self._waiters.values())
