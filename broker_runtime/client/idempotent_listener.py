"""A push consumer listener that runs each message's effect once per group, however often
the message is delivered: `Idempotent` (the de-dup table, in the consumer ledger's
database or in Redis) around a per-message callback.

    store = open_dedup_store(data_dir)                  # or redis_url=...
    consumer = PushConsumer(cfg, group, IdempotentListener(handle, store, group))

A plain (blocking) listener: the consumer runs it on its listener threads.
"""

from __future__ import annotations

from collections.abc import Callable

from broker_runtime.client.consume_service import ConsumeContext
from broker_runtime.client.idempotent import DEFAULT_HOLD_MS, IdempotenceStats, Idempotent
from broker_runtime.client.model import ConsumeStatus, ReceivedMessage
from broker_runtime.common.clock import Clock
from broker_runtime.ledger.dedup import DedupStore

Effect = Callable[[ReceivedMessage], ConsumeStatus]


class IdempotentListener:
    """Consumes a batch message by message; the first that does not succeed fails the batch
    (those before it are CONSUMED in the de-dup table, so a redelivery skips them)."""

    def __init__(
        self,
        callback: Effect,
        store: DedupStore,
        group: str,
        *,
        hold_ms: int = DEFAULT_HOLD_MS,
        clock: Clock | None = None,
    ) -> None:
        self.guard: Idempotent[ReceivedMessage, ConsumeStatus] = Idempotent(
            callback,
            store,
            group,
            success=ConsumeStatus.CONSUME_SUCCESS,
            later=ConsumeStatus.RECONSUME_LATER,
            hold_ms=hold_ms,
            clock=clock,
        )

    @property
    def stats(self) -> IdempotenceStats:
        return self.guard.stats

    def __call__(self, msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeStatus:
        for m in msgs:
            if self.guard(m) != ConsumeStatus.CONSUME_SUCCESS:
                return ConsumeStatus.RECONSUME_LATER
        return ConsumeStatus.CONSUME_SUCCESS
