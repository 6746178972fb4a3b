"""END_TRANSACTION: a producer ends the transaction of a half message (commit, rollback, or
unknown: left for the check), as RocketMQ's EndTransactionProcessor."""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker_runtime.remoting.command import RemotingCommand, response_to
from broker_runtime.remoting.connection import Connection
from broker_runtime.remoting.headers import EndTransactionRequestHeader
from broker_runtime.remoting.protocol import ResponseCode

if TYPE_CHECKING:
    from broker_runtime.broker.controller import BrokerController


class EndTransactionProcessor:
    def __init__(self, ctl: BrokerController) -> None:
        self.ctl = ctl

    async def end(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        if not self.ctl.is_master:
            remark = "Can't process transaction message on a slave broker"
            return response_to(cmd, ResponseCode.SLAVE_NOT_AVAILABLE, remark)
        h = EndTransactionRequestHeader.decode(cmd)
        refusal = await self.ctl.transactions.end(h)
        if refusal is not None:
            return response_to(cmd, ResponseCode.SYSTEM_ERROR, refusal)
        return response_to(cmd, ResponseCode.SUCCESS)
