"""The ledger tables, shared by the clients that write them and the pipeline that reads them."""

from __future__ import annotations

from enum import StrEnum

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    text,
)

from broker_runtime.common import findings


class StubStatus(StrEnum):
    UNCONFIRMED = "UNCONFIRMED"  # recorded before the send; no acknowledgement yet
    CONFIRMED = "CONFIRMED"  # the broker acknowledged the store
    VOID = "VOID"  # given up: never to be resent


class Outcome(StrEnum):
    CONSUMED = "CONSUMED"
    RECONSUME_LATER = "RECONSUME_LATER"
    FAILED = "FAILED"  # the callback raised or returned nothing


class System(StrEnum):
    """The broker a ledger row is about; `topic` is a RabbitMQ row's exchange."""

    ROCKETMQ = findings.ROCKETMQ
    RABBITMQ = findings.RABBITMQ


class Settle(StrEnum):
    """How a RabbitMQ consumer settled a delivery (`message_log.settle`)."""

    ACK = "ack"
    NACK = "nack"
    REJECT = "reject"


class DedupStatus(StrEnum):
    CONSUMING = "CONSUMING"
    CONSUMED = "CONSUMED"


def _one_of(
    table: str, column: str, values: type[StrEnum], nullable: bool = False
) -> CheckConstraint:
    listed = ", ".join(f"'{v.value}'" for v in values)
    test = f"{column} IN ({listed})"
    if nullable:
        test = f"{column} IS NULL OR {test}"
    return CheckConstraint(test, name=f"ck_{table}_{column}")


def _system() -> Column[str]:
    return Column("system", Text, nullable=False, server_default=text("'rocketmq'"))


metadata = MetaData()

message_stub = Table(
    "message_stub",
    metadata,
    Column("msg_id", Text, primary_key=True),  # UNIQ_KEY
    Column("topic", Text, nullable=False),
    Column("tags", Text),
    Column("keys", Text),
    Column("body_hash", Text, nullable=False),  # sha256 hex of the body
    Column("status", Text, nullable=False),
    Column("send_count", Integer, nullable=False),
    Column("broker", Text),
    Column("queue_id", Integer),
    Column("queue_offset", BigInteger),
    Column("next_resend_at", BigInteger),
    Column("created_at", BigInteger, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
    # Added later (older ledgers gain them when opened: engine.ensure_schema). For RabbitMQ
    # `topic` is the exchange and `broker` the virtual host; queue_id/queue_offset stay NULL.
    _system(),
    Column("routing_key", Text),  # RabbitMQ
    Column("headers", Text),  # RabbitMQ: the publish's headers as JSON
    Column("return_reason", Text),  # RabbitMQ: a mandatory publish returned (NO_ROUTE)
    _one_of("message_stub", "status", StubStatus),
    Index("ix_message_stub_status_resend", "status", "next_resend_at"),
)

# The bodies a producer keeps for resends (the stub holds
# only their hash). Optional: without it only messages some broker stored can be resent.
message_body = Table(
    "message_body",
    metadata,
    Column("msg_id", Text, primary_key=True),  # UNIQ_KEY, as message_stub.msg_id
    Column("body", LargeBinary, nullable=False),
    Column("created_at", BigInteger, nullable=False),
)

message_log = Table(
    "message_log",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("msg_id", Text, nullable=False),
    Column("topic", Text, nullable=False),
    Column("group", Text, nullable=False),
    Column("client_id", Text, nullable=False),
    Column("broker", Text, nullable=False),
    Column("queue_id", Integer, nullable=False),
    Column("queue_offset", BigInteger, nullable=False),
    Column("reconsume_times", Integer, nullable=False),
    Column("received_at", BigInteger, nullable=False),
    Column("outcome", Text),  # NULL while in progress
    Column("finished_at", BigInteger),
    # Added later, as in message_stub. A RabbitMQ row: `topic` the exchange, `group` the
    # queue, `client_id` the consumer tag, `broker` the virtual host, `queue_id` the channel
    # number and `queue_offset` the delivery tag; `reconsume_times` is x-delivery-count (or 1
    # for a redelivery without it); outcome CONSUMED for an ack, RECONSUME_LATER for a nack
    # or reject with requeue, FAILED without.
    _system(),
    Column("routing_key", Text),  # RabbitMQ
    Column("redelivered", Boolean),  # RabbitMQ
    Column("settle", Text),  # RabbitMQ: ack, nack or reject
    Column("requeue", Boolean),  # RabbitMQ: with nack and reject
    Column("death", Text),  # RabbitMQ: the delivery's x-death header as JSON (dead letters)
    _one_of("message_log", "outcome", Outcome, nullable=True),
    Index("ix_message_log_msg", "msg_id"),
    Index("ix_message_log_group_queue", "group", "topic", "broker", "queue_id", "queue_offset"),
)

consume_dedup = Table(
    "consume_dedup",
    metadata,
    Column("group", Text, nullable=False),
    Column("msg_id", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("expire_at", BigInteger),  # NULL once CONSUMED: that state does not expire
    Column("updated_at", BigInteger, nullable=False),
    PrimaryKeyConstraint("group", "msg_id"),
    _one_of("consume_dedup", "status", DedupStatus),
)
