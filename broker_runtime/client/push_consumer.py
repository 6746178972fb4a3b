"""The push consumer (RocketMQ's DefaultMQPushConsumer, concurrently): a long-polling pull
loop per owned queue feeds the process queue and the consume service.

Flow control as RocketMQ's: a queue with more than `pull_threshold_for_queue` messages (or
`pull_threshold_size_mib`) in flight, or a span wider than `max_span` offsets between its
oldest and newest in-flight message, is not pulled until it drains.
"""

from __future__ import annotations

import logging
from pathlib import Path

from broker_runtime.client.config import ClientConfig
from broker_runtime.client.consume_service import (
    ConsumeService,
    Listener,
    OutcomeHook,
    ReceivedHook,
)
from broker_runtime.client.consumer_base import ConsumerBase
from broker_runtime.client.model import (
    ConsumeFromWhere,
    MessageModel,
    ReceivedMessage,
)
from broker_runtime.client.process_queue import ProcessQueue
from broker_runtime.client.rebalance import Allocate, MessageQueue, allocate_averagely
from broker_runtime.client.tag_filter import parse
from broker_runtime.common.clock import Clock
from broker_runtime.common.topics import retry_topic
from broker_runtime.remoting.headers import ConsumerSendMsgBackRequestHeader

log = logging.getLogger(__name__)


class PushConsumer(ConsumerBase):
    consume_type = "CONSUME_PASSIVELY"

    def __init__(
        self,
        config: ClientConfig | str,
        group: str,
        listener: Listener,
        *,
        message_model: MessageModel = MessageModel.CLUSTERING,
        consume_from: ConsumeFromWhere = ConsumeFromWhere.LAST_OFFSET,
        consume_timestamp_ms: int | None = None,
        allocate: Allocate = allocate_averagely,
        threads: int = 20,
        batch_max: int = 1,
        pull_threshold_for_queue: int = 1000,
        pull_threshold_size_mib: int = 100,
        max_span: int = 2000,
        max_reconsume_times: int = 16,
        rebalance_interval_s: float = 20.0,
        offsets_dir: Path | None = None,
        pull_batch_size: int = 32,
        suspend_ms: int = 15_000,
        pull_delay_on_error_s: float = 3.0,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(
            config,
            group,
            message_model=message_model,
            consume_from=consume_from,
            consume_timestamp_ms=consume_timestamp_ms,
            allocate=allocate,
            rebalance_interval_s=rebalance_interval_s,
            offsets_dir=offsets_dir,
            pull_batch_size=pull_batch_size,
            suspend_ms=suspend_ms,
            pull_delay_on_error_s=pull_delay_on_error_s,
            clock=clock,
        )
        self.listener = listener
        self.threads = threads
        self.batch_max = batch_max
        self.pull_threshold_for_queue = pull_threshold_for_queue
        self.pull_threshold_bytes = pull_threshold_size_mib << 20
        self.max_span = max_span
        self.max_reconsume_times = max_reconsume_times
        self.on_received: list[ReceivedHook] = []
        self.on_outcome: list[OutcomeHook] = []
        self.service: ConsumeService | None = None

    @property
    def consumed(self) -> int:
        """Messages consumed with CONSUME_SUCCESS so far."""
        return self.service.consumed if self.service is not None else 0

    async def start(self) -> None:
        if self.model is MessageModel.CLUSTERING:
            # Messages sent back after a failure come back on the group's retry topic.
            topic = retry_topic(self.group)
            self.subscriptions.setdefault(topic, parse(topic, "*"))
        self.service = ConsumeService(
            self.listener,
            self.model,
            self.offset_store,
            self._send_back,
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

    def _flow_controlled(self, pq: ProcessQueue) -> bool:
        return (
            len(pq) > self.pull_threshold_for_queue
            or pq.msg_size > self.pull_threshold_bytes
            or pq.max_span() > self.max_span
        )

    def _deliver(self, mq: MessageQueue, pq: ProcessQueue, msgs: list[ReceivedMessage]) -> None:
        assert self.service is not None
        self.service.submit(mq, pq, msgs)

    async def _send_back(self, msg: ReceivedMessage, delay_level: int) -> bool:
        """CONSUMER_SEND_MSG_BACK; False (retry locally) when the broker cannot take it."""
        header = ConsumerSendMsgBackRequestHeader(
            offset=msg.msg.phys_offset,
            group=self.group,
            delay_level=delay_level,
            origin_msg_id=msg.msg_id,
            origin_topic=msg.topic,
            max_reconsume_times=self.max_reconsume_times,
        )
        api = self.instance.api
        try:
            await self.instance.on_node(msg.broker, lambda addr: api.send_back(addr, header))
        except Exception as e:
            log.warning("%s: send-back of %s failed: %s", self.client_id, msg.msg_id, e)
            return False
        return True
