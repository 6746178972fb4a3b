"""Transactional messages, as Apache RocketMQ 4.9's broker keeps them (TransactionalMessage-
ServiceImpl, EndTransactionProcessor, TransactionalMessageCheckService).

- A send with TRAN_MSG=true stores a *half message*: topic RMQ_SYS_TRANS_HALF_TOPIC queue 0,
  the real topic and queue in REAL_TOPIC / REAL_QID, transaction bits cleared, so consumers
  never see it.
- END_TRANSACTION commit writes the real message (COMMIT sysflag, preparedTransactionOffset
  = the half's log offset), then an *op message* to RMQ_SYS_TRANS_OP_HALF_TOPIC (tag "d",
  body the half's queue offset); rollback writes only the op message. Both first check the
  half's producer group, queue offset and log offset. The committed message keeps the half's
  properties, TRAN_MSG and REAL_TOPIC / REAL_QID included: RocketMQ 4.9.7's broker clears
  them from the message's map after it has serialised the map (EndTransactionProcessor), so
  its committed units carry them, and so do these (tests/interop/test_transactions.py).
- The check: every interval, half messages older than the timeout (or their
  CHECK_IMMUNITY_TIME_IN_SECONDS) without an op message are appended again with
  TRANSACTION_CHECK_TIMES + 1 and CHECK_TRANSACTION_STATE goes to a live producer of their
  group; past transaction_check_max checks they go to TRANS_CHECK_MAX_TIME_TOPIC instead.
  How far the check has come is the offsets of group CID_RMQ_SYS_TRANS on both topics.

The message builders are plain functions; `TransactionService` does the I/O.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker_runtime.common.message import (
    CHECK_IMMUNITY_TIME_IN_SECONDS,
    PRODUCER_GROUP,
    REAL_QUEUE_ID,
    REAL_TOPIC,
    TAGS,
    TRAN_MSG,
    TRANSACTION_CHECK_TIMES,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    WAIT,
    Message,
    StoredMessage,
    encode_host,
    with_transaction_type,
)
from broker_runtime.common.topics import (
    TRANS_CHECK_GROUP,
    TRANS_CHECK_MAX_TIME_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
    TRANS_OP_REMOVE_TAG,
)
from broker_runtime.remoting.command import FLAG_ONEWAY, request
from broker_runtime.remoting.connection import Connection, RemotingError
from broker_runtime.remoting.headers import (
    CheckTransactionStateRequestHeader,
    EndTransactionRequestHeader,
)
from broker_runtime.remoting.protocol import RequestCode
from broker_runtime.store import record_codec as codec

if TYPE_CHECKING:
    from broker_runtime.broker.controller import BrokerController

log = logging.getLogger(__name__)

COMMIT, ROLLBACK, UNKNOWN = TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE, 0
PERM_READ_WRITE = 6
CHECK_BATCH = 32


def is_half_send(properties: dict[str, str]) -> bool:
    """A send that opens a transaction (TRAN_MSG parsed as Boolean.parseBoolean)."""
    return properties.get(TRAN_MSG, "").lower() == "true"


def half_message(msg: Message) -> Message:
    """parseHalfMessageInner: the message parked in the half topic."""
    props = {**msg.properties, REAL_TOPIC: msg.topic, REAL_QUEUE_ID: str(msg.queue_id)}
    return _copy(msg, TRANS_HALF_TOPIC, 0, props, with_transaction_type(msg.sys_flag, 0))


def committed_message(half: StoredMessage) -> Message:
    """endMessageTransaction: the real message a commit writes."""
    return Message(
        topic=half.properties[REAL_TOPIC],
        body=half.body,
        properties=dict(half.properties),
        queue_id=int(half.properties[REAL_QUEUE_ID]),
        flag=half.flag,
        sys_flag=with_transaction_type(half.sys_flag, COMMIT),
        born_timestamp=half.born_timestamp,
        born_host=half.born_host,
        reconsume_times=half.reconsume_times,
        prepared_transaction_offset=half.phys_offset,
    )


def op_message(half: StoredMessage, born_ms: int) -> Message:
    """The op message that ends a half message: tag "d", body its queue offset."""
    return Message(
        topic=TRANS_OP_HALF_TOPIC,
        body=str(half.queue_offset).encode(),
        properties={TAGS: TRANS_OP_REMOVE_TAG, WAIT: "true"},
        queue_id=half.queue_id,
        born_timestamp=born_ms,
    )


def rechecked_half(half: StoredMessage, checks: int) -> Message:
    """renewHalfMessageInner: the half message appended again, its check count raised."""
    return _stored_copy(half, TRANS_HALF_TOPIC, {TRANSACTION_CHECK_TIMES: str(checks)})


def discarded_half(half: StoredMessage) -> Message:
    """A half message checked transactionCheckMax times, moved out of the check's way."""
    return _stored_copy(half, TRANS_CHECK_MAX_TIME_TOPIC, {})


def _copy(msg: Message, topic: str, queue_id: int, props: dict[str, str], flag: int) -> Message:
    return Message(
        topic=topic,
        body=msg.body,
        properties=props,
        queue_id=queue_id,
        flag=msg.flag,
        sys_flag=flag,
        born_timestamp=msg.born_timestamp,
        born_host=msg.born_host,
        reconsume_times=msg.reconsume_times,
    )


def _stored_copy(half: StoredMessage, topic: str, extra: dict[str, str]) -> Message:
    return Message(
        topic=topic,
        body=half.body,
        properties={**half.properties, **extra},
        queue_id=0,
        flag=half.flag,
        sys_flag=half.sys_flag,
        born_timestamp=half.born_timestamp,
        born_host=half.born_host,
        reconsume_times=half.reconsume_times,
    )


def end_refusal(half: StoredMessage | None, h: EndTransactionRequestHeader) -> str | None:
    """checkPrepareMessage: why this END_TRANSACTION may not act on `half`, or None."""
    if half is None or half.topic != TRANS_HALF_TOPIC:
        return "Find prepared transaction message failed"
    if half.properties.get(PRODUCER_GROUP) != h.producer_group:
        return "The producer group wrong"
    if half.queue_offset != h.tran_state_table_offset:
        return "The transaction state table offset wrong"
    if half.phys_offset != h.commit_log_offset:
        return "The commit log offset wrong"
    return None


def check_times(half: StoredMessage) -> int:
    return int(half.properties.get(TRANSACTION_CHECK_TIMES, "0") or 0)


def immunity_ms(half: StoredMessage, timeout_ms: int) -> int:
    """How old a half message must be before it is checked: its CHECK_IMMUNITY_TIME_IN_SECONDS
    if it has one (-1 or not a number: the broker's timeout), else the timeout."""
    text = half.properties.get(CHECK_IMMUNITY_TIME_IN_SECONDS)
    try:
        seconds = int(text) if text else -1
    except ValueError:
        seconds = -1
    return timeout_ms if seconds == -1 else seconds * 1000


@dataclass(slots=True)
class CheckReport:
    """What one check pass did."""

    checked: int = 0  # CHECK_TRANSACTION_STATE sent (half appended again)
    discarded: int = 0  # moved to TRANS_CHECK_MAX_TIME_TOPIC
    done: int = 0  # half messages found ended by an op message
    no_producer: int = 0  # due, but no producer of its group is connected


class TransactionService:
    def __init__(self, ctl: BrokerController) -> None:
        self.ctl = ctl
        self.producers: dict[str, dict[str, Connection]] = {}  # group -> client id -> conn
        self._lock = asyncio.Lock()

    # -- producers --------------------------------------------------------------------------
    def producer_seen(self, group: str, client_id: str, conn: Connection) -> None:
        """A producer's heartbeat (ProducerManager.registerProducer)."""
        self.producers.setdefault(group, {})[client_id] = conn

    def _producer(self, group: str) -> Connection | None:
        live = [c for c in self.producers.get(group, {}).values() if not c.closed]
        return live[0] if live else None

    # -- END_TRANSACTION --------------------------------------------------------------------
    async def end(self, h: EndTransactionRequestHeader) -> str | None:
        """Commit or roll back; the refusal's remark, or None. UNKNOWN leaves it for the check."""
        if h.commit_or_rollback not in (COMMIT, ROLLBACK):
            return None
        half = self.ctl.require_store().message_at(h.commit_log_offset)
        refusal = end_refusal(half, h)
        if refusal is not None or half is None:
            return refusal
        async with self._lock:  # a check in progress must not append this half again meanwhile
            writes = [op_message(half, self.ctl.clock.now_ms())]
            if h.commit_or_rollback == COMMIT:
                writes.insert(0, committed_message(half))
            await self._store(writes)
        return None

    async def _store(self, msgs: list[Message]) -> list[codec.DispatchRequest]:
        """Store and replicate as a send would; a replication shortfall is logged."""
        results = await self.ctl.put(msgs)
        code, remark = await self.ctl.replicate(results[-1].phys_offset + results[-1].size)
        if code:
            log.warning("transaction messages stored but not replicated: %s", remark)
        return results

    # -- the check --------------------------------------------------------------------------
    async def check(self) -> CheckReport:
        """One pass over the half queue (TransactionalMessageServiceImpl.check)."""
        async with self._lock:
            return await self._check()

    async def _check(self) -> CheckReport:
        ctl, cfg = self.ctl, self.ctl.config
        store = ctl.require_store()
        report = CheckReport()
        now = ctl.clock.now_ms()
        half_at = max(0, ctl.offsets.query(TRANS_HALF_TOPIC, TRANS_CHECK_GROUP, 0))
        op_at = max(0, ctl.offsets.query(TRANS_OP_HALF_TOPIC, TRANS_CHECK_GROUP, 0))
        ops = store.get_messages(TRANS_OP_HALF_TOPIC, 0, op_at, 1 << 30).messages
        ended = {int(m.body) for m in ops if m.body.isdigit()}
        offset = half_at
        while True:
            batch = store.get_messages(TRANS_HALF_TOPIC, 0, offset, CHECK_BATCH)
            if not batch.messages:
                break
            stop = False
            for half in batch.messages:
                if half.queue_offset in ended:
                    report.done += 1
                elif half.store_timestamp >= now:
                    stop = True  # stored after this pass began
                elif now - half.born_timestamp < immunity_ms(half, cfg.transaction_timeout_ms):
                    stop = True  # not due yet; nor is anything after it
                elif check_times(half) >= cfg.transaction_check_max:
                    await self._store([discarded_half(half)])
                    report.discarded += 1
                    log.warning(
                        "transaction %s given up after %d checks", half.uniq_key, check_times(half)
                    )
                elif not await self._check_back(half, report):
                    stop = True  # keep it where it is: a producer may come back
                if stop:
                    break
                offset = half.queue_offset + 1
            if stop:
                break
            offset = batch.next_offset
        ctl.offsets.commit(TRANS_HALF_TOPIC, TRANS_CHECK_GROUP, 0, offset)
        # The op offset moves past the ops of half messages behind the half offset only: an
        # op of one still ahead must be read again next time (calculateOpOffset).
        for op in ops:
            if not op.body.isdigit() or int(op.body) >= offset:
                break
            op_at = op.queue_offset + 1
        ctl.offsets.commit(TRANS_OP_HALF_TOPIC, TRANS_CHECK_GROUP, 0, op_at)
        return report

    async def _check_back(self, half: StoredMessage, report: CheckReport) -> bool:
        """Append the half again with one more check, and ask its producer; False when no
        producer of its group is connected (nothing is appended then)."""
        group = half.properties.get(PRODUCER_GROUP, "")
        conn = self._producer(group)
        if conn is None:
            report.no_producer += 1
            return False
        [renewed] = await self._store([rechecked_half(half, check_times(half) + 1)])
        store = self.ctl.require_store()
        stored = store.message_at(renewed.phys_offset)
        if stored is None:
            return True
        h = CheckTransactionStateRequestHeader(
            tran_state_table_offset=stored.queue_offset,
            commit_log_offset=stored.phys_offset,
            msg_id=stored.uniq_key,
            transaction_id=stored.uniq_key,
            offset_msg_id=stored.msg_id,
        )
        cmd = request(RequestCode.CHECK_TRANSACTION_STATE, h.fields(), self._as_real(stored))
        cmd.flag |= FLAG_ONEWAY
        try:
            conn.send(cmd)
            report.checked += 1
        except RemotingError as e:
            log.info("check-back of %s to %s failed: %s", stored.uniq_key, conn.peer, e)
        return True

    def _as_real(self, half: StoredMessage) -> bytes:
        """The half message's unit, with its real topic and queue back (as RocketMQ sends it)."""
        real = Message(
            topic=half.properties.get(REAL_TOPIC, half.topic),
            body=half.body,
            properties=half.properties,
            queue_id=int(half.properties.get(REAL_QUEUE_ID, half.queue_id)),
            flag=half.flag,
            sys_flag=with_transaction_type(half.sys_flag, TRANSACTION_NOT_TYPE),
            born_timestamp=half.born_timestamp,
            born_host=half.born_host,
            reconsume_times=half.reconsume_times,
        )
        out = bytearray()
        host = encode_host(half.store_host)
        store_ip, store_port = host[:4], int.from_bytes(host[4:], "big")
        codec.encode_into(
            out, codec.prepare(real), half.queue_offset, half.phys_offset,
            half.store_timestamp, store_ip, store_port,
        )  # fmt: skip
        return bytes(out)

    def ensure_topics(self) -> None:
        """The system topics, on a master, as the broker creates them at start."""
        for topic in (TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC, TRANS_CHECK_MAX_TIME_TOPIC):
            self.ctl.ensure_topic(topic, 1, PERM_READ_WRITE)

    async def run(self) -> None:
        """The check service: a pass every transaction_check_interval_ms, on masters."""
        while True:
            await asyncio.sleep(self.ctl.config.transaction_check_interval_ms / 1000)
            if not self.ctl.is_master or self.ctl.store is None:
                continue
            try:
                report = await self.check()
            except Exception:
                log.exception("transaction check failed")
                continue
            if report.checked or report.discarded:
                log.info("transaction check: %s", report)
