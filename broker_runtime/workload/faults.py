"""Faults the workload injects into its own clients, as the network would.

- Lost send responses: the producer's request reaches the broker, which stores the message
  and answers; the answer is dropped before the producer reads it, and the send attempt
  fails as a timeout would. The producer retries (elsewhere) and the message is stored a
  second time with the same UNIQ_KEY.
- Unreachable broker: the producer's requests for chosen messages never reach the broker
  (every attempt, retries included, fails as a refused connection would). The send fails,
  nothing is stored, and the message's ledger stub stays UNCONFIRMED: the resend job's work.
- Lost acks: a consumer's offset commits of one queue past an offset never reach the broker
  (neither UPDATE_CONSUMER_OFFSET nor the offset piggy-backed on pulls); the consumer goes
  on as if they had. After it dies, that queue is consumed again from the last commit that
  arrived (the ack lost after processing).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from broker_runtime.client.model import PullResult, SendResult
from broker_runtime.client.producer import Producer
from broker_runtime.client.puller import Puller
from broker_runtime.client.push_consumer import PushConsumer
from broker_runtime.client.rebalance import MessageQueue
from broker_runtime.client.tag_filter import Subscription
from broker_runtime.remoting.connection import RemotingConnectError, RemotingTimeoutError
from broker_runtime.remoting.headers import SendMessageRequestHeader

log = logging.getLogger(__name__)

Send = Callable[
    [str, MessageQueue, SendMessageRequestHeader, bytes, tuple[str, ...], float],
    Awaitable[SendResult],
]


@dataclass
class LostResponses:
    """Drops the answer to the first send attempt of chosen messages (by UNIQ_KEY), and
    every request of the `unreachable` ones before it reaches the broker.

    `dropped` keeps what each dropped answer said: where the broker stored the message.
    """

    victims: set[str] = field(default_factory=set)
    unreachable: set[str] = field(default_factory=set)
    dropped: dict[str, SendResult] = field(default_factory=dict)

    def install(self, producer: Producer) -> None:
        api = producer.instance.api
        real: Send = api.send

        async def send(
            addr: str,
            mq: MessageQueue,
            header: SendMessageRequestHeader,
            body: bytes,
            msg_ids: tuple[str, ...],
            timeout: float,
        ) -> SendResult:
            victim = msg_ids[0] if len(msg_ids) == 1 else None
            if victim in self.unreachable:
                raise RemotingConnectError(
                    f"{addr} unreachable for the send of {victim} (injected)"
                )
            result = await real(addr, mq, header, body, msg_ids, timeout)
            if victim in self.victims and victim not in self.dropped:
                self.dropped[victim] = result
                raise RemotingTimeoutError(f"response to the send of {victim} lost (injected)")
            return result

        setattr(api, "send", send)  # noqa: B010 - replaces the bound method on this object only


class _LossyPuller(Puller):
    """Leaves out the commit offset a pull would carry when it is an ack to be lost."""

    def __init__(self, inner: Puller, lossy: Callable[[MessageQueue, int], bool]) -> None:
        super().__init__(inner.instance, inner.group)
        self.suggested = inner.suggested
        self.lossy = lossy

    async def pull(
        self,
        mq: MessageQueue,
        sub: Subscription,
        offset: int,
        max_nums: int,
        commit_offset: int | None = None,
        suspend_ms: int = 0,
        timeout_s: float = 3.0,
    ) -> PullResult:
        if commit_offset is not None and self.lossy(mq, commit_offset):
            commit_offset = None
        return await super().pull(mq, sub, offset, max_nums, commit_offset, suspend_ms, timeout_s)


class LossyAckConsumer(PushConsumer):
    """A push consumer whose commits of one queue past an offset are lost on the way."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lossy: tuple[MessageQueue, int] | None = None
        self._on_lost: Callable[[int], object] = lambda offset: None
        self.acks_lost = 0

    def lose_acks(self, mq: MessageQueue, above: int, on_lost: Callable[[int], object]) -> None:
        """Commits of `mq` with an offset above `above` are lost; `on_lost(offset)` each time."""
        self._lossy = (mq, above)
        self._on_lost = on_lost
        self.puller = _LossyPuller(self.puller, self._is_lost)

    def _is_lost(self, mq: MessageQueue, offset: int) -> bool:
        return self._lossy is not None and mq == self._lossy[0] and offset > self._lossy[1]

    async def _commit_offset(self, mq: MessageQueue, offset: int) -> None:
        if self._is_lost(mq, offset):
            self.acks_lost += 1
            self._on_lost(offset)
            log.info("%s: ack of %s at %d lost (injected)", self.client_id, mq, offset)
            return
        await super()._commit_offset(mq, offset)
