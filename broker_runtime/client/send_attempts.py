"""The attempts of one send: the producer's one retry loop, for its asyncio and blocking paths.

`attempts(...)` is a generator that yields the queue of each attempt and is sent back how the
attempt went (a SendResult, or the error): round robin over the topic's queues, not on the
broker the previous attempt failed on nor on brokers isolated by recent failures, a failed
broker isolated and the route refreshed, an answer no retry improves raised at once, and after
the last attempt one error naming every failure. The asyncio path (`Producer.send`) and the
blocking one (`Producer.send_blocking`) only do the I/O of each attempt: `drive_async` and
`drive` run the loop with it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator

from broker_runtime.client.model import MQBrokerError, MQClientError, SendResult
from broker_runtime.client.rebalance import MessageQueue
from broker_runtime.client.route import FaultTable, PublishInfo
from broker_runtime.common.clock import Clock
from broker_runtime.remoting.connection import RemotingError
from broker_runtime.remoting.protocol import ResponseCode

# Broker answers after which another broker may do better (sendDefaultImpl's list).
RETRY_CODES = frozenset(
    {
        ResponseCode.TOPIC_NOT_EXIST,
        ResponseCode.SERVICE_NOT_AVAILABLE,
        ResponseCode.SYSTEM_ERROR,
        ResponseCode.SYSTEM_BUSY,
        ResponseCode.NO_PERMISSION,
    }
)

Failure = RemotingError | MQClientError
Outcome = SendResult | Failure
Attempts = Generator[MessageQueue, Outcome, SendResult]


def attempts(
    topic: str,
    info: PublishInfo,
    times: int,
    faults: FaultTable,
    clock: Clock,
    refresh_route: Callable[[str], None],
) -> Attempts:
    """Yields each attempt's queue; send it the attempt's outcome. Returns the SendResult, or
    raises the error to give the caller."""
    errors: list[str] = []
    error: BaseException | None = None
    last_broker: str | None = None
    for _ in range(times):
        mq = info.select(last_broker, faults, clock.now_ms())
        last_broker = mq.broker
        outcome = yield mq
        if isinstance(outcome, SendResult):
            faults.succeeded(mq.broker)
            return outcome
        faults.failed(mq.broker, clock.now_ms())
        refresh_route(mq.topic)
        if isinstance(outcome, MQBrokerError) and outcome.code not in RETRY_CODES:
            raise outcome
        errors.append(f"{mq.broker}: {outcome}")
        error = outcome
    gave_up = MQClientError(
        f"send to {topic} failed after {len(errors)} attempt(s): {'; '.join(errors)}"
    )
    raise gave_up from error


def drive(loop: Attempts, send: Callable[[MessageQueue], SendResult]) -> SendResult:
    """Run the attempts with a blocking `send` of one attempt to one queue."""
    step: MessageQueue | SendResult = next(loop)
    while isinstance(step, MessageQueue):
        step = _advance(loop, _outcome(send, step))
    return step


async def drive_async(
    loop: Attempts, send: Callable[[MessageQueue], Awaitable[SendResult]]
) -> SendResult:
    """Run the attempts with an asyncio `send` of one attempt to one queue."""
    step: MessageQueue | SendResult = next(loop)
    while isinstance(step, MessageQueue):
        step = _advance(loop, await _outcome_async(send, step))
    return step


def _outcome(send: Callable[[MessageQueue], SendResult], mq: MessageQueue) -> Outcome:
    try:
        return send(mq)
    except (RemotingError, MQClientError) as e:
        return e


async def _outcome_async(
    send: Callable[[MessageQueue], Awaitable[SendResult]], mq: MessageQueue
) -> Outcome:
    try:
        return await send(mq)
    except (RemotingError, MQClientError) as e:
        return e


def _advance(loop: Attempts, outcome: Outcome) -> MessageQueue | SendResult:
    """The next attempt's queue, or the send's result (its error is raised)."""
    try:
        return loop.send(outcome)
    except StopIteration as done:
        result: SendResult = done.value
        return result
