"""CHECK_CLIENT_CONFIG: a push consumer asks, as it starts, whether this broker takes its
subscription (RocketMQ's ClientManageProcessor.checkClientConfig). Tag subscriptions always
pass; a SQL92 one needs `enable_property_filter` and an expression that compiles, so a bad
expression is refused at subscription with its position instead of at every pull."""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker_runtime.broker.processors.pull import subscription_or_refusal
from broker_runtime.remoting.bodies import BodyError, decode_json
from broker_runtime.remoting.command import RemotingCommand, response_to
from broker_runtime.remoting.connection import Connection
from broker_runtime.remoting.protocol import ResponseCode

if TYPE_CHECKING:
    from broker_runtime.broker.controller import BrokerController


class ClientConfigProcessor:
    def __init__(self, ctl: BrokerController) -> None:
        self.ctl = ctl

    async def check(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        try:
            body = decode_json(cmd.body or b"{}", "CheckClientRequestBody")
        except BodyError as exc:
            return response_to(cmd, ResponseCode.SYSTEM_ERROR, str(exc))
        sub = body.get("subscriptionData")
        if isinstance(sub, dict):
            kind = sub.get("expressionType") or "TAG"
            refused = subscription_or_refusal(self.ctl, cmd, sub.get("subString"), str(kind))
            if isinstance(refused, RemotingCommand):
                return refused
        return response_to(cmd, ResponseCode.SUCCESS)
