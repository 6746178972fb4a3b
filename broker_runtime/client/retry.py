"""Consume retry on the client: what happens to a message the listener failed.

As RocketMQ's DefaultMQPushConsumerImpl.sendMessageBack: first CONSUMER_SEND_MSG_BACK (the
broker stores a copy in `%RETRY%{group}` with delay level 3 + reconsumeTimes, or in
`%DLQ%{group}` past `max_reconsume_times`); when that request fails, the client sends the
copy to `%RETRY%{group}` itself through an inner producer, with RECONSUME_TIME and
MAX_RECONSUME_TIMES (the broker routes it to the DLQ at the limit); when that fails too,
`send_back` answers False and the consume service consumes the message again locally after
a delay: the same delivery repeated on this client, a duplicate source the audit sees.

Messages pulled from `%RETRY%{group}` get their first topic back from RETRY_TOPIC before the
listener sees them (resetRetryTopic). A group's retry topic appears on the brokers when the
group first heartbeats, after the consumer's first rebalance: after a send-back the consumer
is asked to rebalance until it has a route for it, so retries do not wait 20 s for the next
periodic rebalance.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from broker_runtime.client.config import ClientConfig
from broker_runtime.client.instance import ClientInstance
from broker_runtime.client.model import ReceivedMessage
from broker_runtime.client.producer import Producer
from broker_runtime.common.constants import FIRST_RETRY_LEVEL
from broker_runtime.common.message import (
    DELAY,
    MAX_RECONSUME_TIMES,
    ORIGIN_MESSAGE_ID,
    RECONSUME_TIME,
    RETRY_TOPIC,
    Message,
)
from broker_runtime.common.topics import retry_topic
from broker_runtime.remoting.headers import ConsumerSendMsgBackRequestHeader

log = logging.getLogger(__name__)

INNER_PRODUCER_GROUP = "CLIENT_INNER_PRODUCER"
ROUTE_POLL_S = 0.5
ROUTE_POLL_TRIES = 40


def restore_retry_topic(group: str, msgs: Sequence[ReceivedMessage]) -> None:
    """Give messages pulled from `%RETRY%{group}` their first topic back (resetRetryTopic)."""
    own_retry = retry_topic(group)
    for m in msgs:
        first = m.properties.get(RETRY_TOPIC)
        if first and m.msg.topic == own_retry:
            m.msg.topic = first


def retry_copy(
    msg: ReceivedMessage, group: str, max_reconsume_times: int, delay_level: int = 0
) -> Message:
    """The copy a client sends to `%RETRY%{group}` itself when CONSUMER_SEND_MSG_BACK failed.

    Every property is kept (UNIQ_KEY included, so the copy is the same message); lineage as
    the broker writes it (RETRY_TOPIC, ORIGIN_MESSAGE_ID = the offset id of the first stored
    copy); RECONSUME_TIME is the failed delivery's count + 1, as RocketMQ's client sends it.
    """
    props = dict(msg.properties)
    props.setdefault(RETRY_TOPIC, msg.topic)
    if not props.get(ORIGIN_MESSAGE_ID):
        props[ORIGIN_MESSAGE_ID] = msg.offset_msg_id
    props[RECONSUME_TIME] = str(msg.reconsume_times + 1)
    props[MAX_RECONSUME_TIMES] = str(max_reconsume_times)
    props[DELAY] = str(delay_level if delay_level > 0 else FIRST_RETRY_LEVEL + msg.reconsume_times)
    return Message(topic=retry_topic(group), body=msg.body, properties=props, flag=msg.msg.flag)


class ConsumeRetry:
    """Sends a failed message back for one consumer; `send_back` is the consume service's
    SendBack callable. `rebalance_now` is called while the group's retry topic has no route.
    """

    def __init__(
        self,
        instance: ClientInstance,
        config: ClientConfig,
        group: str,
        max_reconsume_times: int,
        rebalance_now: Callable[[], None],
    ) -> None:
        if max_reconsume_times < 0:
            raise ValueError(f"max_reconsume_times must be >= 0, got {max_reconsume_times}")
        self.instance = instance
        self.config = config
        self.group = group
        self.max_reconsume_times = max_reconsume_times
        self.rebalance_now = rebalance_now
        self.sent_back = 0  # by CONSUMER_SEND_MSG_BACK
        self.sent_direct = 0  # by the inner producer, after CONSUMER_SEND_MSG_BACK failed
        self.failed = 0  # neither worked: consumed again locally
        self._producer: Producer | None = None
        self._producer_lock = asyncio.Lock()
        self._watch: asyncio.Task[None] | None = None

    async def send_back(self, msg: ReceivedMessage, delay_level: int) -> bool:
        """True when the broker took the message back; False: consume it again here."""
        try:
            await self._send_msg_back(msg, delay_level)
            self.sent_back += 1
        except Exception as e:
            log.warning("send-back of %s failed (%s): sending it to %s directly",
                        msg.msg_id, e, retry_topic(self.group))  # fmt: skip
            try:
                await self.send_to_retry_topic(msg, delay_level)
                self.sent_direct += 1
            except Exception as e2:
                self.failed += 1
                log.warning("retry send of %s failed too (%s): consumed again locally",
                            msg.msg_id, e2)  # fmt: skip
                return False
        self._watch_retry_route()
        return True

    async def _send_msg_back(self, msg: ReceivedMessage, delay_level: int) -> None:
        header = ConsumerSendMsgBackRequestHeader(
            offset=msg.msg.phys_offset,
            group=self.group,
            delay_level=delay_level,
            origin_msg_id=msg.msg_id,
            origin_topic=msg.topic,
            max_reconsume_times=self.max_reconsume_times,
        )
        api = self.instance.api
        await self.instance.on_node(msg.broker, lambda addr: api.send_back(addr, header))

    async def send_to_retry_topic(self, msg: ReceivedMessage, delay_level: int) -> None:
        """Send `retry_copy` of `msg` through the inner producer (raises when it fails)."""
        async with self._producer_lock:
            if self._producer is None:
                producer = Producer(self.config, INNER_PRODUCER_GROUP)
                await producer.start()
                self._producer = producer
        copy = retry_copy(msg, self.group, self.max_reconsume_times, delay_level)
        await self._producer.send(copy)

    def _watch_retry_route(self) -> None:
        """Until the retry topic is routed, ask for a rebalance every ROUTE_POLL_S."""
        topic = retry_topic(self.group)
        if topic in self.instance.routes or (self._watch is not None and not self._watch.done()):
            return

        async def watch() -> None:
            for _ in range(ROUTE_POLL_TRIES):
                self.rebalance_now()
                await asyncio.sleep(ROUTE_POLL_S)
                if topic in self.instance.routes:
                    self.rebalance_now()
                    return
            log.warning("%s has no route yet: retries wait for the next rebalance", topic)

        self._watch = asyncio.get_running_loop().create_task(watch())

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
        if self._producer is not None:
            await self._producer.shutdown()
            self._producer = None
