"""The ledgers written by the clients: producer stubs and the consumer log.

A producer with a `ProducerLedger` records each message's stub (UNCONFIRMED) before its
first send attempt, and confirms it with where the broker stored it once the send returns
SEND_OK; any other outcome (an error, or a status such as SLAVE_NOT_AVAILABLE that is not
an acknowledgement) leaves it UNCONFIRMED for the resend job. A consumer with a
`ConsumerLedger` logs each delivery right before the listener runs and its outcome right
after, before the batch is acknowledged: an acknowledged message always has its outcome in
the log, and a consumer that dies mid-batch leaves outcome NULL.

All calls go through a `LedgerWriter`: one thread per ledger that merges the requests
queued while it was busy into one transaction (group commit), so that concurrent sends and
consume batches share commits. A caller waits for its own rows either way.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import logging
import queue
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from broker_runtime.client.consume_service import (
    ConsumeContext,
    Listener,
    OutcomeHook,
    ReceivedHook,
)
from broker_runtime.client.model import ConsumeStatus, ReceivedMessage, SendResult, SendStatus
from broker_runtime.client.producer import Producer
from broker_runtime.client.rebalance import MessageQueue
from broker_runtime.common.message import Message
from broker_runtime.ledger.consumer import ConsumerLedger, Receipt
from broker_runtime.ledger.producer import Confirmation, ProducerLedger, StubRecord
from broker_runtime.ledger.schema import Outcome

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class _Call:
    fn: Callable[[Sequence[Any]], Any]
    items: Sequence[Any]
    future: concurrent.futures.Future[Any] = field(default_factory=concurrent.futures.Future)


class LedgerWriter:
    """One thread running ledger calls; queued calls to the same method run as one.

    A merged call's result is split back when it is a list with one entry per item (the
    row ids of `record_received`); otherwise every caller gets it whole.
    """

    def __init__(self, name: str = "ledger-writer", max_batch: int = 2000) -> None:
        self.max_batch = max_batch
        self.transactions = 0
        self.errors = 0
        self._queue: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(
        self, fn: Callable[[Sequence[T]], Any], items: Sequence[T]
    ) -> concurrent.futures.Future[Any]:
        if self._closed:
            raise RuntimeError("the ledger writer is closed")
        call = _Call(fn, items)
        self._queue.put(call)
        return call.future

    def _run(self) -> None:
        pending: _Call | None = None
        while True:
            call = pending or self._queue.get()
            pending = None
            if call is None:  # close(): everything queued before it has run
                return
            batch, size = [call], len(call.items)
            while size < self.max_batch:  # what queued up meanwhile, same method only
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None or nxt.fn != call.fn:
                    if nxt is None:
                        self._queue.put(None)  # stop once the one taken out has run
                    else:
                        pending = nxt
                    break
                batch.append(nxt)
                size += len(nxt.items)
            self._execute(batch)

    def _execute(self, batch: list[_Call]) -> None:
        items = [item for c in batch for item in c.items]
        # A caller that stopped waiting (its task was cancelled) still gets its rows written:
        # what it asked to log did happen.
        try:
            result = batch[0].fn(items)
        except Exception as e:
            self.errors += 1
            for c in batch:
                with contextlib.suppress(concurrent.futures.InvalidStateError):
                    c.future.set_exception(e)
            return
        self.transactions += 1
        split = isinstance(result, list) and len(result) == len(items) and len(batch) > 1
        start = 0
        for c in batch:
            n = len(c.items)
            with contextlib.suppress(concurrent.futures.InvalidStateError):  # cancelled
                c.future.set_result(result[start : start + n] if split else result)
            start += n

    def close(self) -> None:
        """Run what is queued, then stop the thread."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join()


def _wait(future: concurrent.futures.Future[T]) -> Awaitable[T] | T:
    """On an event loop thread an awaitable; on any other thread the result itself."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return future.result()
    return asyncio.wrap_future(future)


# -- producer ---------------------------------------------------------------------------------


class ProducerLedgerHooks:
    """Stub before send, confirm on SEND_OK; `attach` adds the hooks to a producer.

    `keep_bodies`: keep each body with its stub (`message_body`), so that the resend job and
    the repair of a loss after acknowledgement can send the message again.
    """

    def __init__(
        self,
        ledger: ProducerLedger,
        writer: LedgerWriter | None = None,
        *,
        keep_bodies: bool = False,
    ) -> None:
        self.ledger = ledger
        self.writer = writer or LedgerWriter("producer-ledger")
        self.keep_bodies = keep_bodies
        self.confirm_errors = 0

    def attach(self, producer: Producer) -> ProducerLedgerHooks:
        producer.on_before_send.append(self.before_send)
        producer.on_send_result.append(self.send_result)
        return self

    def before_send(self, msg: Message) -> Awaitable[object] | object:
        """A failure here fails the send: a message without its stub is not sent."""
        if self.keep_bodies:
            return _wait(self.writer.submit(self._record_with_bodies, [msg]))
        return _wait(self.writer.submit(self.ledger.record_before_send, [StubRecord.of(msg)]))

    def _record_with_bodies(self, msgs: Sequence[Message]) -> list[str]:
        known = self.ledger.record_before_send([StubRecord.of(m) for m in msgs])
        self.ledger.keep_bodies(msgs)
        return known

    async def send_result(
        self, msg: Message, result: SendResult | None, error: BaseException | None
    ) -> None:
        if result is None or result.status is not SendStatus.SEND_OK:
            return
        c = Confirmation(result.msg_id, result.mq.broker, result.mq.queue_id, result.queue_offset)
        try:
            await asyncio.wrap_future(self.writer.submit(self.ledger.confirm, [c]))
        except Exception as e:  # the message is stored; an unconfirmed stub means a resend
            self.confirm_errors += 1
            log.error("stub of %s not confirmed (it may be resent): %s", result.msg_id, e)

    def close(self) -> None:
        self.writer.close()
        self.ledger.close()


# -- consumer ---------------------------------------------------------------------------------


class HookedConsumer(Protocol):
    """A push consumer (concurrent or orderly): a listener and hooks around it."""

    listener: Listener
    on_received: list[ReceivedHook]
    on_outcome: list[OutcomeHook]
    running: bool


_OUTCOMES = {
    ConsumeStatus.CONSUME_SUCCESS: Outcome.CONSUMED,
    ConsumeStatus.RECONSUME_LATER: Outcome.RECONSUME_LATER,
}


class ConsumerLedgerHooks:
    """Log each delivery and its outcome; `attach` (before `start`) wraps the listener so
    that an exception or a None result is logged as FAILED rather than RECONSUME_LATER.

    A ledger that cannot be written is logged and counted in `errors`; consumption goes on.
    """

    def __init__(
        self, ledger: ConsumerLedger, group: str, client_id: str, writer: LedgerWriter | None = None
    ) -> None:
        self.ledger = ledger
        self.group = group
        self.client_id = client_id
        self.writer = writer or LedgerWriter("consumer-ledger")
        self.errors = 0
        self._rows: dict[int, int] = {}  # id(message) -> its log row, while being consumed
        self._failed: set[int] = set()  # id(message) whose listener raised or returned None
        self._lock = threading.Lock()

    def attach(self, consumer: HookedConsumer) -> ConsumerLedgerHooks:
        if consumer.running:
            raise RuntimeError("attach the ledger before the consumer starts")
        consumer.listener = self.wrap(consumer.listener)
        consumer.on_received.append(self.received)
        consumer.on_outcome.append(self.outcome)
        return self

    def wrap(self, listener: Listener) -> Listener:
        """The listener, noting batches that raised or returned None (FAILED outcomes)."""
        failed = self._failed

        def mark(msgs: list[ReceivedMessage]) -> None:
            with self._lock:
                failed.update(id(m) for m in msgs)

        if inspect.iscoroutinefunction(listener):
            inner_async = listener

            async def async_listener(
                msgs: list[ReceivedMessage], ctx: ConsumeContext
            ) -> ConsumeStatus | None:
                try:
                    status: ConsumeStatus | None = await inner_async(msgs, ctx)
                except BaseException:
                    mark(msgs)
                    raise
                if status is None:
                    mark(msgs)
                return status

            return async_listener

        def sync_listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> Any:
            try:
                status = listener(msgs, ctx)
            except BaseException:
                mark(msgs)
                raise
            if status is None:
                mark(msgs)
            return status

        return sync_listener

    def received(self, mq: MessageQueue, msgs: list[ReceivedMessage]) -> object:
        # The topic and queue pulled from (%RETRY%{group} for a retry), not the restored one.
        receipts = [
            Receipt(
                m.msg_id, mq.topic, self.group, self.client_id, mq.broker, m.queue_id,
                m.queue_offset, m.reconsume_times,
            )
            for m in msgs
        ]  # fmt: skip
        future = self.writer.submit(self.ledger.record_received, receipts)

        def keep(ids: list[int]) -> None:
            with self._lock:
                self._rows.update(zip((id(m) for m in msgs), ids, strict=True))

        return self._settle(future, keep, f"receipt of {len(msgs)} message(s)")

    def outcome(
        self, mq: MessageQueue, msgs: list[ReceivedMessage], status: ConsumeStatus
    ) -> object:
        pairs: list[tuple[int, Outcome]] = []
        with self._lock:
            for m in msgs:
                row = self._rows.pop(id(m), None)
                failed = id(m) in self._failed
                self._failed.discard(id(m))
                if row is not None:
                    pairs.append((row, Outcome.FAILED if failed else _OUTCOMES[status]))
        if not pairs:
            return None
        future = self.writer.submit(self.ledger.record_outcome, pairs)
        return self._settle(future, None, f"outcome of {len(pairs)} message(s)")

    def _settle(
        self,
        future: concurrent.futures.Future[Any],
        then: Callable[[Any], None] | None,
        what: str,
    ) -> object:
        def finish(value: Any) -> None:
            if then is not None:
                then(value)

        def failed(e: BaseException) -> None:
            self.errors += 1
            log.error("%s: %s not logged in the consumer ledger: %s", self.client_id, what, e)

        try:
            asyncio.get_running_loop()
        except RuntimeError:  # a listener thread: wait here
            try:
                finish(future.result())
            except Exception as e:
                failed(e)
            return None

        async def on_loop() -> None:
            try:
                finish(await asyncio.wrap_future(future))
            except Exception as e:
                failed(e)

        return on_loop()

    def close(self) -> None:
        self.writer.close()
        self.ledger.close()
