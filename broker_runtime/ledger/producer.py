"""The producer's message stubs: written before a send, confirmed after it.

A stub is UNCONFIRMED from `record_before_send` until the broker's acknowledgement arrives
(`confirm`, with where it was stored). The resend job picks stubs still unconfirmed past
`next_resend_at`; each resend bumps `send_count` and pushes `next_resend_at` back by
`ResendBackoff`. `void` gives a stub up for good. Each call is one transaction, whatever
the size of the batch it is given.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, case, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from broker_runtime.common.clock import Clock, SystemClock
from broker_runtime.common.message import Message
from broker_runtime.ledger.engine import chunks, open_ledger, run_tx
from broker_runtime.ledger.schema import StubStatus, System, message_body, message_stub


class StubError(LookupError):
    """Some stubs of a batch could not be updated; the others were."""

    def __init__(self, action: str, unknown: Sequence[str], void: Sequence[str] = ()) -> None:
        self.unknown = list(unknown)
        self.void = list(void)
        parts = []
        if self.unknown:
            parts.append(f"{len(self.unknown)} never recorded: {self.unknown[:5]}")
        if self.void:
            parts.append(f"{len(self.void)} void: {self.void[:5]}")
        super().__init__(f"cannot {action} {'; '.join(parts)}")


def body_hash(body: bytes) -> str:
    """sha256 hex of a message body, the stub's `body_hash`."""
    return hashlib.sha256(body).hexdigest()


@dataclass(frozen=True, slots=True)
class StubRecord:
    msg_id: str  # UNIQ_KEY
    topic: str
    body_hash: str
    tags: str | None = None
    keys: str | None = None
    system: System = System.ROCKETMQ
    routing_key: str | None = None  # RabbitMQ; `topic` is then the exchange
    headers: str | None = None  # RabbitMQ: JSON

    @classmethod
    def of(cls, msg: Message) -> StubRecord:
        """The stub of a message the producer has given its UNIQ_KEY."""
        if not msg.uniq_key:
            raise ValueError(f"a message to {msg.topic} has no UNIQ_KEY: give it one before send")
        return cls(msg.uniq_key, msg.topic, body_hash(msg.body), msg.tags, msg.keys)


@dataclass(frozen=True, slots=True)
class Confirmation:
    msg_id: str
    broker: str  # RabbitMQ: the virtual host
    queue_id: int | None  # None for RabbitMQ, which names no queue in a confirm
    queue_offset: int | None


@dataclass(frozen=True)
class ResendBackoff:
    """Wait `first_ms` after a send, then `factor` times longer after each resend, up to `max_ms`.

    The first wait must cover how long a message may sit in the queue before it is consumed
    ("resendTime" includes the backlog), or healthy messages get resent.
    """

    first_ms: int = 60_000
    factor: float = 2.0
    max_ms: int = 3_600_000

    def delay_ms(self, send_count: int) -> int:
        """The wait after the `send_count`-th send (1 = the original one)."""
        if send_count < 1:
            raise ValueError(f"send_count starts at 1, got {send_count}")
        try:
            return int(min(self.max_ms, self.first_ms * self.factor ** (send_count - 1)))
        except OverflowError:
            return self.max_ms


class ProducerLedger:
    def __init__(
        self,
        engine: Engine,
        *,
        clock: Clock | None = None,
        backoff: ResendBackoff | None = None,
    ) -> None:
        self.engine = engine
        self.clock = clock or SystemClock()
        self.backoff = backoff or ResendBackoff()
        # Built once: statement construction costs more than a small SQLite transaction.
        dialect_insert = pg_insert if engine.dialect.name == "postgresql" else sqlite_insert
        self._record = (
            dialect_insert(message_stub)
            .on_conflict_do_nothing(index_elements=["msg_id"])
            .returning(message_stub.c.msg_id)
        )
        self._keep_body = dialect_insert(message_body).on_conflict_do_nothing(
            index_elements=["msg_id"]
        )
        self._confirm = (
            update(message_stub)
            .where(message_stub.c.msg_id == bindparam("b_msg_id"))
            .values(
                status=case(
                    (message_stub.c.status == StubStatus.VOID.value, StubStatus.VOID.value),
                    else_=StubStatus.CONFIRMED.value,
                ),
                broker=bindparam("b_broker"),
                queue_id=bindparam("b_queue_id"),
                queue_offset=bindparam("b_queue_offset"),
                next_resend_at=None,
                updated_at=bindparam("b_now"),
            )
        )
        self._returned = (
            update(message_stub)
            .where(message_stub.c.msg_id == bindparam("b_msg_id"))
            .values(return_reason=bindparam("b_reason"), updated_at=bindparam("b_now"))
        )
        self._resent = (
            update(message_stub)
            .where(message_stub.c.msg_id == bindparam("b_msg_id"))
            .values(
                status=StubStatus.UNCONFIRMED.value,
                send_count=bindparam("b_send_count"),
                next_resend_at=bindparam("b_next"),
                updated_at=bindparam("b_now"),
            )
        )

    @classmethod
    def open(cls, data_dir: Path | None, url: str | None = None, **options: Any) -> ProducerLedger:
        """The ledger at `DIR/ledger/producer.db`, or in the database at `url`.

        `options` go to the constructor; for engine settings build the engine with
        `open_ledger` and pass it to `ProducerLedger(...)`.
        """
        return cls(open_ledger(data_dir, "producer", url), **options)

    def record_before_send(self, stubs: Sequence[StubRecord]) -> list[str]:
        """Record UNCONFIRMED stubs (send_count 1); returns the msg_ids that already had one.

        An existing stub is left as it is: recording it again is not a resend.
        """
        if not stubs:
            return []
        now = self.clock.now_ms()
        rows = [
            {
                "msg_id": s.msg_id,
                "topic": s.topic,
                "tags": s.tags,
                "keys": s.keys,
                "body_hash": s.body_hash,
                "status": StubStatus.UNCONFIRMED.value,
                "send_count": 1,
                "next_resend_at": now + self.backoff.delay_ms(1),
                "created_at": now,
                "updated_at": now,
                "system": System(s.system).value,
                "routing_key": s.routing_key,
                "headers": s.headers,
            }
            for s in stubs
        ]

        def work(conn: Connection) -> list[str]:
            inserted = set(conn.execute(self._record, rows).scalars())
            return [s.msg_id for s in stubs if s.msg_id not in inserted]

        return run_tx(self.engine, work)

    def confirm(self, confirmations: Sequence[Confirmation]) -> None:
        """Mark stubs CONFIRMED where the broker stored them (a VOID stub stays VOID).

        Raises StubError naming the ids never recorded, after confirming the rest.
        """
        if not confirmations:
            return
        now = self.clock.now_ms()
        params = [
            {
                "b_msg_id": c.msg_id,
                "b_broker": c.broker,
                "b_queue_id": c.queue_id,
                "b_queue_offset": c.queue_offset,
                "b_now": now,
            }
            for c in confirmations
        ]
        ids = [c.msg_id for c in confirmations]

        def work(conn: Connection) -> list[str]:
            result = conn.execute(self._confirm, params)
            if conn.dialect.supports_sane_multi_rowcount and result.rowcount == len(params):
                return []
            return self._missing(conn, ids)

        unknown = run_tx(self.engine, work)
        if unknown:
            raise StubError("confirm", unknown)

    def mark_returned(self, returns: Sequence[tuple[str, str]]) -> None:
        """RabbitMQ: (msg_id, reply text) of mandatory publishes the broker returned unrouted
        (it still confirms them). Raises StubError for ids never recorded."""
        if not returns:
            return
        now = self.clock.now_ms()
        params = [{"b_msg_id": m, "b_reason": r, "b_now": now} for m, r in returns]
        ids = [m for m, _ in returns]

        def work(conn: Connection) -> list[str]:
            result = conn.execute(self._returned, params)
            if conn.dialect.supports_sane_multi_rowcount and result.rowcount == len(params):
                return []
            return self._missing(conn, ids)

        unknown = run_tx(self.engine, work)
        if unknown:
            raise StubError("mark returned", unknown)

    def mark_resent(self, msg_ids: Sequence[str]) -> dict[str, int]:
        """After a resend: send_count + 1, UNCONFIRMED again, next_resend_at backed off.

        Returns the new send_count of each stub. Raises StubError for stubs never recorded or
        VOID (those are left alone), after updating the rest.
        """
        if not msg_ids:
            return {}
        now = self.clock.now_ms()

        def work(conn: Connection) -> tuple[dict[str, int], list[str], list[str]]:
            counts: dict[str, int] = {}
            void: list[str] = []
            for chunk in chunks(sorted(set(msg_ids))):
                query = select(
                    message_stub.c.msg_id, message_stub.c.send_count, message_stub.c.status
                ).where(message_stub.c.msg_id.in_(chunk))
                for msg_id, send_count, status in conn.execute(query.with_for_update()):
                    if status == StubStatus.VOID:
                        void.append(msg_id)
                    else:
                        counts[msg_id] = send_count + 1
            if counts:
                params = [
                    {
                        "b_msg_id": m,
                        "b_send_count": n,
                        "b_next": now + self.backoff.delay_ms(n),
                        "b_now": now,
                    }
                    for m, n in counts.items()
                ]
                conn.execute(self._resent, params)
            unknown = [m for m in dict.fromkeys(msg_ids) if m not in counts and m not in void]
            return counts, unknown, void

        counts, unknown, void = run_tx(self.engine, work)
        if unknown or void:
            raise StubError("mark resent", unknown, void)
        return counts

    def void(self, msg_ids: Sequence[str]) -> None:
        """Give stubs up: VOID, never to be resent. Raises StubError for ids never recorded."""
        if not msg_ids:
            return
        now = self.clock.now_ms()
        ids = list(dict.fromkeys(msg_ids))

        def work(conn: Connection) -> list[str]:
            done = 0
            for chunk in chunks(ids):
                result = conn.execute(
                    update(message_stub)
                    .where(message_stub.c.msg_id.in_(chunk))
                    .values(status=StubStatus.VOID.value, next_resend_at=None, updated_at=now)
                )
                done += result.rowcount
            return [] if done == len(ids) else self._missing(conn, ids)

        unknown = run_tx(self.engine, work)
        if unknown:
            raise StubError("void", unknown)

    def keep_bodies(self, msgs: Sequence[Message]) -> None:
        """Keep the bodies of messages for their resends (a body kept before is left as is).

        Call it with `record_before_send`; the resend job takes a body from here first.
        """
        self.keep_bodies_of([(StubRecord.of(m).msg_id, m.body) for m in msgs])

    def keep_bodies_of(self, bodies: Sequence[tuple[str, bytes]]) -> None:
        """`keep_bodies` by (msg_id, body): publishes that are not `Message`s (pika's)."""
        if not bodies:
            return
        now = self.clock.now_ms()
        rows = [{"msg_id": msg_id, "body": body, "created_at": now} for msg_id, body in bodies]
        run_tx(self.engine, lambda conn: conn.execute(self._keep_body, rows))

    def bodies(self, msg_ids: Sequence[str]) -> dict[str, bytes]:
        """The kept bodies of these messages, by msg_id (those without one are left out)."""

        def work(conn: Connection) -> dict[str, bytes]:
            out: dict[str, bytes] = {}
            for chunk in chunks(sorted(set(msg_ids))):
                query = select(message_body.c.msg_id, message_body.c.body)
                for msg_id, body in conn.execute(query.where(message_body.c.msg_id.in_(chunk))):
                    out[msg_id] = bytes(body)
            return out

        return run_tx(self.engine, work) if msg_ids else {}

    def close(self) -> None:
        """Close the pooled connections (the engine can be used again afterwards)."""
        self.engine.dispose()

    def get(self, msg_id: str) -> dict[str, Any] | None:
        """One stub as a dict of its columns, or None."""

        def work(conn: Connection) -> dict[str, Any] | None:
            row = conn.execute(select(message_stub).where(message_stub.c.msg_id == msg_id)).first()
            return dict(row._mapping) if row is not None else None

        return run_tx(self.engine, work)

    @staticmethod
    def _missing(conn: Connection, ids: Sequence[str]) -> list[str]:
        found: set[str] = set()
        for chunk in chunks(sorted(set(ids))):
            query = select(message_stub.c.msg_id).where(message_stub.c.msg_id.in_(chunk))
            found.update(conn.execute(query).scalars())
        return [m for m in dict.fromkeys(ids) if m not in found]
