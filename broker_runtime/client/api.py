"""The client's requests to name servers and brokers (RocketMQ's MQClientAPIImpl).

One method per request: builds the header, signs it when ACL keys are set, sends it over the
shared RemotingClient and turns the response into a result or an MQBrokerError. No state
beyond the connections and the name server the client currently talks to.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from broker_runtime.acl.signing import sign_command
from broker_runtime.client.config import ClientConfig
from broker_runtime.client.model import (
    MQBrokerError,
    MQClientError,
    PullResult,
    PullStatus,
    ReceivedMessage,
    SendResult,
    SendStatus,
)
from broker_runtime.client.rebalance import MessageQueue
from broker_runtime.remoting.bodies import HeartbeatData, TopicRouteData, decode_json
from broker_runtime.remoting.client import RemotingClient
from broker_runtime.remoting.command import RemotingCommand, request
from broker_runtime.remoting.connection import RemotingError
from broker_runtime.remoting.headers import (
    ConsumerSendMsgBackRequestHeader,
    OffsetResponseHeader,
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    QueueOffsetHeader,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
    TopicHeader,
    TopicQueueHeader,
    UnregisterClientRequestHeader,
)
from broker_runtime.remoting.protocol import CLIENT_VERSION, RequestCode, ResponseCode
from broker_runtime.remoting.server import Processor, ProcessorTable
from broker_runtime.store.record_codec import RecordError, check_unit, decode

_SEND_STATUS = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK,
    ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}
_PULL_STATUS = {
    ResponseCode.SUCCESS: PullStatus.FOUND,
    ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
    ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL,
}


def decode_messages(body: bytes, broker: str) -> list[ReceivedMessage]:
    """A pull response body: CommitLog units back to back, each checked (CRC included)."""
    out = []
    pos, n = 0, len(body)
    while pos < n:
        try:
            size = check_unit(body, pos, n)
        except RecordError as e:
            raise MQClientError(f"pull body from {broker} is corrupt: {e}") from e
        if size < 0:
            raise MQClientError(f"pull body from {broker} has a blank unit at {pos}")
        out.append(ReceivedMessage(decode(body, pos), broker))
        pos += size
    return out


def send_result(
    resp: RemotingCommand, addr: str, mq: MessageQueue, msg_ids: tuple[str, ...]
) -> SendResult:
    """A send's response as its result; MQBrokerError for an answer that is not a store."""
    status = _SEND_STATUS.get(resp.code)  # type: ignore[call-overload]
    if status is None:
        raise MQBrokerError(resp.code, resp.remark, addr)
    rh = SendMessageResponseHeader.decode(resp)
    if rh.queue_id != mq.queue_id:
        mq = MessageQueue(mq.topic, mq.broker, rh.queue_id)
    return SendResult(status, msg_ids[0], rh.msg_id, mq, rh.queue_offset, msg_ids)


class MQClientAPI:
    """Requests over one RemotingClient; `handlers` serve requests brokers send back."""

    def __init__(
        self, config: ClientConfig, handlers: Mapping[int, Processor] | None = None
    ) -> None:
        self.config = config
        self.remoting = RemotingClient(ProcessorTable(dict(handlers or {})))
        self._ns_index = random.randrange(len(config.name_servers))
        self.timeout = config.request_timeout_s
        self.refused: MQBrokerError | None = None  # the latest NO_PERMISSION answer (ACL)

    async def close(self) -> None:
        await self.remoting.close()

    def _sign(self, cmd: RemotingCommand) -> RemotingCommand:
        """Every request of the client: its version (brokers act on it), and the ACL
        signature when keys are set."""
        cmd.version = CLIENT_VERSION
        if self.config.access_key is not None and self.config.secret_key is not None:
            sign_command(cmd, self.config.access_key, self.config.secret_key)
        return cmd

    async def invoke(
        self, addr: str, cmd: RemotingCommand, timeout: float | None = None
    ) -> RemotingCommand:
        resp = await self.remoting.invoke(addr, self._sign(cmd), timeout or self.timeout)
        if resp.code == ResponseCode.NO_PERMISSION:
            self.refused = MQBrokerError(resp.code, resp.remark, addr)
        return resp

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        await self.remoting.invoke_oneway(addr, self._sign(cmd))

    async def invoke_namesrv(self, cmd: RemotingCommand) -> RemotingCommand:
        """Ask the current name server; on a network error move on to the next one.

        Every server is tried once from where this call started: a concurrent call moving
        `_ns_index` meanwhile must not send this one back to a server it found dead.
        """
        servers = self.config.name_servers
        errors = []
        start = self._ns_index
        for i in range(len(servers)):
            idx = (start + i) % len(servers)
            try:
                resp = await self.invoke(servers[idx], cmd)
            except RemotingError as e:
                errors.append(str(e))
                continue
            self._ns_index = idx
            return resp
        raise MQClientError(f"no name server answered: {'; '.join(errors)}")

    @staticmethod
    def check(resp: RemotingCommand, addr: str, *ok: int) -> RemotingCommand:
        if resp.code not in (ok or (ResponseCode.SUCCESS,)):
            raise MQBrokerError(resp.code, resp.remark, addr)
        return resp

    # -- name server ------------------------------------------------------------------------
    async def get_route(self, topic: str) -> TopicRouteData | None:
        """The topic's route, or None when no name server knows the topic."""
        cmd = request(RequestCode.GET_ROUTEINFO_BY_TOPIC, TopicHeader(topic=topic).fields())
        resp = await self.invoke_namesrv(cmd)
        if resp.code == ResponseCode.TOPIC_NOT_EXIST:
            return None
        self.check(resp, "name server")
        return TopicRouteData.decode(resp.body)

    async def namesrv_json(self, code: int, fields: dict[str, object] | None = None) -> Any:
        resp = self.check(await self.invoke_namesrv(request(code, fields)), "name server")
        return decode_json(resp.body, str(code)) if resp.body else {}

    # -- send -------------------------------------------------------------------------------
    async def send(
        self,
        addr: str,
        mq: MessageQueue,
        header: SendMessageRequestHeader,
        body: bytes,
        msg_ids: tuple[str, ...],
        timeout: float,
    ) -> SendResult:
        resp = await self.remoting.invoke(addr, self.send_request(header, body), timeout)
        return send_result(resp, addr, mq, msg_ids)

    def send_request(self, header: SendMessageRequestHeader, body: bytes) -> RemotingCommand:
        """A SEND_MESSAGE (or SEND_BATCH_MESSAGE) request, signed; for any transport."""
        if header.batch:
            return self._sign(request(RequestCode.SEND_BATCH_MESSAGE, header.v2().fields(), body))
        return self._sign(request(RequestCode.SEND_MESSAGE, header.fields(), body))

    async def send_oneway(self, addr: str, header: SendMessageRequestHeader, body: bytes) -> None:
        await self.invoke_oneway(addr, request(RequestCode.SEND_MESSAGE, header.fields(), body))

    async def send_back(self, addr: str, header: ConsumerSendMsgBackRequestHeader) -> None:
        cmd = request(RequestCode.CONSUMER_SEND_MSG_BACK, header.fields())
        self.check(await self.invoke(addr, cmd), addr)

    # -- pull and offsets -------------------------------------------------------------------
    async def pull(
        self, addr: str, broker: str, header: PullMessageRequestHeader, timeout: float
    ) -> PullResult:
        resp = await self.invoke(addr, request(RequestCode.PULL_MESSAGE, header.fields()), timeout)
        status = _PULL_STATUS.get(resp.code)  # type: ignore[call-overload]
        if status is None:
            raise MQBrokerError(resp.code, resp.remark, addr)
        rh = PullMessageResponseHeader.decode(resp)
        msgs = decode_messages(resp.body, broker) if status is PullStatus.FOUND else []
        return PullResult(
            status,
            rh.next_begin_offset,
            rh.min_offset,
            rh.max_offset,
            msgs,
            rh.suggest_which_broker_id,
        )

    async def query_consumer_offset(self, addr: str, group: str, mq: MessageQueue) -> int:
        """The group's committed offset of `mq`, -1 when it has none."""
        header = QueueOffsetHeader(group, mq.topic, mq.queue_id)
        resp = await self.invoke(addr, request(RequestCode.QUERY_CONSUMER_OFFSET, header.fields()))
        if resp.code == ResponseCode.QUERY_NOT_FOUND:
            return -1
        self.check(resp, addr)
        return OffsetResponseHeader.decode(resp).offset

    async def update_consumer_offset(
        self, addr: str, group: str, mq: MessageQueue, offset: int
    ) -> None:
        header = QueueOffsetHeader(group, mq.topic, mq.queue_id, offset)
        cmd = request(RequestCode.UPDATE_CONSUMER_OFFSET, header.fields())
        self.check(await self.invoke(addr, cmd), addr)

    async def queue_offset(self, addr: str, code: int, mq: MessageQueue, ts: int | None) -> int:
        """GET_MAX_OFFSET / GET_MIN_OFFSET / SEARCH_OFFSET_BY_TIMESTAMP of one queue."""
        header = TopicQueueHeader(mq.topic, mq.queue_id, ts)
        resp = self.check(await self.invoke(addr, request(code, header.fields())), addr)
        return OffsetResponseHeader.decode(resp).offset

    # -- membership -------------------------------------------------------------------------
    async def heartbeat(self, addr: str, data: HeartbeatData) -> None:
        cmd = request(RequestCode.HEART_BEAT, body=data.encode())
        self.check(await self.invoke(addr, cmd), addr)

    async def unregister(
        self, addr: str, client_id: str, producer_group: str | None, consumer_group: str | None
    ) -> None:
        header = UnregisterClientRequestHeader(client_id, producer_group, consumer_group)
        cmd = request(RequestCode.UNREGISTER_CLIENT, header.fields())
        self.check(await self.invoke(addr, cmd), addr)

    async def consumer_ids(self, addr: str, group: str) -> list[str]:
        header = TopicHeader(consumer_group=group)
        cmd = request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, header.fields())
        resp = await self.invoke(addr, cmd)
        if resp.code in (ResponseCode.SYSTEM_ERROR, ResponseCode.CONSUMER_NOT_ONLINE):
            return []  # the broker knows no member of the group (yet)
        self.check(resp, addr)
        ids = decode_json(resp.body, "consumer list").get("consumerIdList", [])
        return [str(i) for i in ids]

    async def broker_json(self, addr: str, code: int, fields: dict[str, object]) -> Any:
        """Any request answered with a JSON body (admin views)."""
        resp = self.check(await self.invoke(addr, request(code, fields)), addr)
        return decode_json(resp.body, str(code)) if resp.body else {}
