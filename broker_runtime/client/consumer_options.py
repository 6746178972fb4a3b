"""The settings every consumer takes, in one object (the push, orderly and lite pull consumers
add their own beside it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from broker_runtime.client.model import ConsumeFromWhere, MessageModel
from broker_runtime.client.rebalance import Allocate, allocate_averagely
from broker_runtime.common.clock import Clock

HALF_HOUR_MS = 30 * 60 * 1000
# Apache RocketMQ's broker looks at held pulls every 5 s (PullRequestHoldService), so an
# idle queue's long poll is answered up to 5 s after its suspendTimeoutMillis: a client
# that waits only the suspend time plus its request timeout gives up first (and its next
# pull waits pull_delay_on_error_s).
HOLD_CHECK_S = 5.0


@dataclass(frozen=True)
class ConsumerOptions:
    """RocketMQ's shared consumer settings (messageModel, consumeFromWhere, consumeTimestamp,
    allocateMessageQueueStrategy, ...), with its defaults."""

    message_model: MessageModel = MessageModel.CLUSTERING
    consume_from: ConsumeFromWhere = ConsumeFromWhere.LAST_OFFSET
    consume_timestamp_ms: int | None = None  # CONSUME_FROM_TIMESTAMP; None: half an hour ago
    allocate: Allocate = allocate_averagely
    rebalance_interval_s: float = 20.0
    offsets_dir: Path | None = None  # broadcasting: where this client's offset files go
    pull_batch_size: int = 32
    suspend_ms: int = 15_000  # how long a pull may wait on the broker for new messages
    pull_delay_on_error_s: float = 3.0
    clock: Clock | None = None

    def start_timestamp_ms(self, now_ms: int) -> int:
        """Where CONSUME_FROM_TIMESTAMP starts: the time given, else half an hour ago."""
        if self.consume_timestamp_ms is not None:
            return self.consume_timestamp_ms
        return now_ms - HALF_HOUR_MS
