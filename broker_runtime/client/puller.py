"""One pull of one queue (RocketMQ's PullAPIWrapper).

Reads from the node the broker last suggested, else the master, else a slave (a node that
refuses the connection is passed over at once), piggy-backs the commit offset when reading
from the master, and re-checks tags on the client: the broker filters by tag hash codes.
"""

from __future__ import annotations

from broker_runtime.client.instance import ClientInstance
from broker_runtime.client.model import PullResult
from broker_runtime.client.rebalance import MessageQueue
from broker_runtime.client.tag_filter import Subscription
from broker_runtime.remoting.bodies import MASTER_ID
from broker_runtime.remoting.headers import PullMessageRequestHeader
from broker_runtime.remoting.protocol import FLAG_COMMIT_OFFSET, FLAG_SUBSCRIPTION, FLAG_SUSPEND


class Puller:
    def __init__(self, instance: ClientInstance, group: str) -> None:
        self.instance = instance
        self.group = group
        self.suggested: dict[MessageQueue, int] = {}  # pullFromWhichNodeTable

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
        masters = {a for b, a in self.instance.brokers.get(mq.broker, {}).items() if b == MASTER_ID}

        async def call(addr: str) -> PullResult:
            # As DefaultMQPushConsumerImpl: only an offset > 0 rides along. A queue's first
            # pulls carry its start (often 0) while the first messages are being consumed;
            # one the broker handles after the next commit sets the group back there (the
            # real broker stores it, with "[NOTIFYME]update consumer offset less than store").
            commit = commit_offset is not None and commit_offset > 0 and addr in masters
            sys_flag = FLAG_SUBSCRIPTION | (FLAG_SUSPEND if suspend_ms > 0 else 0)
            header = PullMessageRequestHeader(
                consumer_group=self.group,
                topic=mq.topic,
                queue_id=mq.queue_id,
                queue_offset=offset,
                max_msg_nums=max_nums,
                sys_flag=sys_flag | (FLAG_COMMIT_OFFSET if commit else 0),
                commit_offset=commit_offset if commit and commit_offset is not None else -1,
                suspend_timeout_millis=suspend_ms,
                subscription=sub.expression,
                expression_type=sub.expression_type,
                client_id=self.instance.client_id,
            )
            return await self.instance.api.pull(addr, mq.broker, header, timeout_s)

        result = await self.instance.on_node(mq.broker, call, self.suggested.get(mq, MASTER_ID))
        self.suggested[mq] = result.suggest_which_broker_id
        if result.messages and not sub.all:
            result.messages = [m for m in result.messages if sub.matches(m.tags)]
        return result
