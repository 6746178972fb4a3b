"""Transactional sends (RocketMQ's TransactionMQProducer), on asyncio.

`send_in_transaction` sends a half message (TRAN_MSG=true, PGROUP, the PREPARED sysflag),
runs the local transaction, then ends it one way with END_TRANSACTION: commit, rollback, or
unknown (the broker then asks later). The broker asks with CHECK_TRANSACTION_STATE, which
the listener's `check` answers, also with an END_TRANSACTION. A half message that was not
stored is rolled back without running the local transaction, as RocketMQ's client does.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from broker_runtime.client.api import decode_messages
from broker_runtime.client.config import ClientConfig
from broker_runtime.client.model import ReceivedMessage, SendResult, SendStatus
from broker_runtime.client.producer import DEFAULT_GROUP, Producer
from broker_runtime.common.message import (
    PRODUCER_GROUP,
    TRAN_MSG,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    Message,
    decode_offset_msg_id,
)
from broker_runtime.remoting.bodies import MASTER_ID
from broker_runtime.remoting.command import RemotingCommand, request
from broker_runtime.remoting.connection import Connection
from broker_runtime.remoting.headers import (
    CheckTransactionStateRequestHeader,
    EndTransactionRequestHeader,
)
from broker_runtime.remoting.protocol import RequestCode

log = logging.getLogger(__name__)


class LocalTransactionState(StrEnum):
    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    UNKNOW = "UNKNOW"  # RocketMQ's spelling


END_CODES = {
    LocalTransactionState.COMMIT_MESSAGE: TRANSACTION_COMMIT_TYPE,
    LocalTransactionState.ROLLBACK_MESSAGE: TRANSACTION_ROLLBACK_TYPE,
    LocalTransactionState.UNKNOW: 0,
}

State = LocalTransactionState | Awaitable[LocalTransactionState]


class TransactionListener(Protocol):
    """The application's side: run the local transaction; say how one ended when asked."""

    def execute(self, msg: Message, arg: object) -> State: ...

    def check(self, msg: ReceivedMessage) -> State: ...


@dataclass(frozen=True, slots=True)
class TransactionSendResult:
    send: SendResult
    state: LocalTransactionState


async def _settle(state: State) -> LocalTransactionState:
    return await state if inspect.isawaitable(state) else state


class TransactionProducer:
    def __init__(
        self,
        config: ClientConfig | str,
        group: str = DEFAULT_GROUP,
        listener: TransactionListener | None = None,
        **producer_options: object,
    ) -> None:
        if listener is None:
            raise ValueError("a transaction producer needs a TransactionListener")
        self.listener = listener
        handlers = {RequestCode.CHECK_TRANSACTION_STATE: self._on_check}
        self.producer = Producer(config, group, handlers=handlers, **producer_options)  # type: ignore[arg-type]
        self.group = self.producer.group

    async def start(self) -> None:
        await self.producer.start()

    async def shutdown(self) -> None:
        await self.producer.shutdown()

    async def __aenter__(self) -> TransactionProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    async def send_in_transaction(self, msg: Message, arg: object = None) -> TransactionSendResult:
        """Half message, local transaction, END_TRANSACTION (DefaultMQProducerImpl's
        sendMessageInTransaction). The listener raising leaves the transaction UNKNOW."""
        msg.properties[TRAN_MSG] = "true"
        msg.properties[PRODUCER_GROUP] = self.group
        msg.sys_flag |= TRANSACTION_PREPARED_TYPE
        result = await self.producer.send(msg)
        if result.status is not SendStatus.SEND_OK:
            state = LocalTransactionState.ROLLBACK_MESSAGE
        else:
            try:
                state = await _settle(self.listener.execute(msg, arg))
            except Exception:
                log.exception("local transaction of %s failed: left UNKNOW", result.msg_id)
                state = LocalTransactionState.UNKNOW
        addr = self.producer.instance.brokers.get(result.mq.broker, {}).get(MASTER_ID)
        if addr is None:
            raise ValueError(f"no master address for broker {result.mq.broker}")
        _, commit_log_offset = decode_offset_msg_id(result.offset_msg_id)
        await self._end(addr, result.queue_offset, commit_log_offset, result.msg_id, state, False)
        return TransactionSendResult(result, state)

    async def _end(
        self,
        addr: str,
        queue_offset: int,
        commit_log_offset: int,
        msg_id: str | None,
        state: LocalTransactionState,
        from_check: bool,
    ) -> None:
        h = EndTransactionRequestHeader(
            producer_group=self.group,
            tran_state_table_offset=queue_offset,
            commit_log_offset=commit_log_offset,
            commit_or_rollback=END_CODES[state],
            from_transaction_check=from_check,
            msg_id=msg_id,
            transaction_id=msg_id,
        )
        cmd = request(RequestCode.END_TRANSACTION, h.fields())
        await self.producer.instance.api.invoke_oneway(addr, cmd)

    async def _on_check(self, cmd: RemotingCommand, conn: Connection) -> None:
        """CHECK_TRANSACTION_STATE from a broker: ask the listener, answer that broker."""
        h = CheckTransactionStateRequestHeader.decode(cmd)
        [msg] = decode_messages(cmd.body or b"", conn.peer)
        try:
            state = await _settle(self.listener.check(msg))
        except Exception:
            log.exception("transaction check of %s failed: left UNKNOW", msg.msg_id)
            state = LocalTransactionState.UNKNOW
        await self._end(
            conn.peer, h.tran_state_table_offset, h.commit_log_offset,
            h.msg_id or msg.msg_id, state, True,
        )  # fmt: skip
