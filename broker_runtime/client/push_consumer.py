"""The push consumer (RocketMQ's DefaultMQPushConsumer, concurrently): a long-polling pull
loop per owned queue feeds the process queue and the consume service.

Flow control as RocketMQ's: a queue with more than `pull_threshold_for_queue` messages (or
`pull_threshold_size_mib`) in flight, or a span wider than `max_span` offsets between its
oldest and newest in-flight message, is not pulled until it drains.
"""

from __future__ import annotations

from broker_runtime.client.config import ClientConfig
from broker_runtime.client.consume_service import (
    ConsumeService,
    Listener,
    OutcomeHook,
    ReceivedHook,
)
from broker_runtime.client.consumer_base import ConsumerBase
from broker_runtime.client.consumer_options import ConsumerOptions
from broker_runtime.client.model import (
    MessageModel,
    ReceivedMessage,
)
from broker_runtime.client.process_queue import ProcessQueue
from broker_runtime.client.rebalance import MessageQueue
from broker_runtime.client.retry import ConsumeRetry, restore_retry_topic
from broker_runtime.client.tag_filter import parse
from broker_runtime.common.constants import MAX_RECONSUME_TIMES
from broker_runtime.common.topics import retry_topic


class PushConsumer(ConsumerBase):
    consume_type = "CONSUME_PASSIVELY"

    def __init__(
        self,
        config: ClientConfig | str,
        group: str,
        listener: Listener,
        options: ConsumerOptions | None = None,
        *,
        threads: int = 20,
        batch_max: int = 1,
        pull_threshold_for_queue: int = 1000,
        pull_threshold_size_mib: int = 100,
        max_span: int = 2000,
        max_reconsume_times: int = MAX_RECONSUME_TIMES,
    ) -> None:
        super().__init__(config, group, options)
        self.listener = listener
        self.threads = threads
        self.batch_max = batch_max
        self.pull_threshold_for_queue = pull_threshold_for_queue
        self.pull_threshold_bytes = pull_threshold_size_mib << 20
        self.max_span = max_span
        self.on_received: list[ReceivedHook] = []
        self.on_outcome: list[OutcomeHook] = []
        self.service: ConsumeService | None = None
        self.retry = ConsumeRetry(
            self.instance, self.config, self.group, max_reconsume_times, self.rebalance_now
        )

    @property
    def consumed(self) -> int:
        """Messages consumed with CONSUME_SUCCESS so far."""
        return self.service.consumed if self.service is not None else 0

    async def start(self) -> None:
        if self.model is MessageModel.CLUSTERING:
            # Messages sent back after a failure come back on the group's retry topic.
            topic = retry_topic(self.group)
            self.subscriptions.setdefault(topic, parse(topic, "*"))
            if self._restore_retry_topic not in self.on_received:
                self.on_received.insert(0, self._restore_retry_topic)
        self.service = ConsumeService(
            self.listener,
            self.model,
            self.offset_store,
            self.retry.send_back,
            self.threads,
            self.batch_max,
            now_ms=self.clock.now_ms,
        )
        self.service.on_received = self.on_received
        self.service.on_outcome = self.on_outcome
        await super().start()

    async def _stop_consuming(self, grace_s: float) -> None:
        await super()._stop_consuming(grace_s)
        if self.service is not None:
            await self.service.shutdown(grace_s)
        await self.retry.close()

    def _flow_controlled(self, pq: ProcessQueue) -> bool:
        return (
            len(pq) > self.pull_threshold_for_queue
            or pq.msg_size > self.pull_threshold_bytes
            or pq.max_span() > self.max_span
        )

    def _deliver(self, mq: MessageQueue, pq: ProcessQueue, msgs: list[ReceivedMessage]) -> None:
        assert self.service is not None
        self.service.submit(mq, pq, msgs)

    def _restore_retry_topic(self, mq: MessageQueue, msgs: list[ReceivedMessage]) -> None:
        restore_retry_topic(self.group, msgs)
