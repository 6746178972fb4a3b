"""The consumer's message log: one row per delivery, written on receipt.

`record_received` right after a pull returns the rows' ids; `record_outcome` fills in how the
consumption ended. A row whose outcome stays NULL was received and never finished (the
consumer died, or is still at it). Every delivery gets its own row, so duplicates show.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, insert, select, update

from broker_runtime.common.clock import Clock, SystemClock
from broker_runtime.common.message import StoredMessage
from broker_runtime.ledger.engine import chunks, open_ledger, run_tx
from broker_runtime.ledger.schema import Outcome, message_log


class LogError(LookupError):
    """Outcomes for log rows that do not exist (the others were recorded)."""


@dataclass(frozen=True, slots=True)
class Receipt:
    """One delivery; `topic`/`broker`/`queue_id`/`queue_offset` name the queue it came from."""

    msg_id: str  # UNIQ_KEY
    topic: str
    group: str
    client_id: str
    broker: str
    queue_id: int
    queue_offset: int
    reconsume_times: int = 0

    @classmethod
    def of(cls, msg: StoredMessage, group: str, client_id: str, broker: str) -> Receipt:
        """A pulled message's receipt; a message without UNIQ_KEY is named by its offset id.

        The topic is the one pulled from (`%RETRY%{group}` for a retry), matching the queue
        coordinates; the commitlog's RETRY_TOPIC property leads back to the first topic.
        """
        return cls(
            msg.uniq_key or msg.msg_id,
            msg.topic,
            group,
            client_id,
            broker,
            msg.queue_id,
            msg.queue_offset,
            msg.reconsume_times,
        )


class ConsumerLedger:
    def __init__(self, engine: Engine, *, clock: Clock | None = None) -> None:
        self.engine = engine
        self.clock = clock or SystemClock()
        # Built once: statement construction costs more than a small SQLite transaction.
        self._receive = insert(message_log).returning(
            message_log.c.id, sort_by_parameter_order=True
        )
        self._outcome = (
            update(message_log)
            .where(message_log.c.id == bindparam("b_id"))
            .values(outcome=bindparam("b_outcome"), finished_at=bindparam("b_now"))
        )

    @classmethod
    def open(cls, data_dir: Path | None, url: str | None = None, **options: Any) -> ConsumerLedger:
        """The ledger at `DIR/ledger/consumer.db`, or in the database at `url`."""
        return cls(open_ledger(data_dir, "consumer", url), **options)

    def record_received(self, receipts: Sequence[Receipt]) -> list[int]:
        """Log deliveries (outcome NULL); returns their row ids in the order given."""
        if not receipts:
            return []
        now = self.clock.now_ms()
        rows = [
            {
                "msg_id": r.msg_id,
                "topic": r.topic,
                "group": r.group,
                "client_id": r.client_id,
                "broker": r.broker,
                "queue_id": r.queue_id,
                "queue_offset": r.queue_offset,
                "reconsume_times": r.reconsume_times,
                "received_at": now,
            }
            for r in receipts
        ]

        def work(conn: Connection) -> list[int]:
            return list(conn.execute(self._receive, rows).scalars())

        return run_tx(self.engine, work)

    def record_outcome(self, outcomes: Sequence[tuple[int, Outcome]]) -> None:
        """Set outcome and finished_at of log rows; raises LogError for unknown ids."""
        if not outcomes:
            return
        now = self.clock.now_ms()
        params = [{"b_id": i, "b_outcome": Outcome(o).value, "b_now": now} for i, o in outcomes]

        def work(conn: Connection) -> list[int]:
            result = conn.execute(self._outcome, params)
            if conn.dialect.supports_sane_multi_rowcount and result.rowcount == len(params):
                return []
            ids = sorted({i for i, _ in outcomes})
            found: set[int] = set()
            for chunk in chunks(ids):
                query = select(message_log.c.id).where(message_log.c.id.in_(chunk))
                found.update(conn.execute(query).scalars())
            return [i for i in ids if i not in found]

        unknown = run_tx(self.engine, work)
        if unknown:
            raise LogError(f"no message_log rows with ids {unknown[:10]}")

    def close(self) -> None:
        """Close the pooled connections (the engine can be used again afterwards)."""
        self.engine.dispose()

    def rows(self, msg_id: str | None = None) -> list[dict[str, Any]]:
        """Log rows as dicts, oldest first; all of them, or those of one message."""
        query = select(message_log).order_by(message_log.c.id)
        if msg_id is not None:
            query = query.where(message_log.c.msg_id == msg_id)

        def work(conn: Connection) -> list[dict[str, Any]]:
            return [dict(r._mapping) for r in conn.execute(query)]

        return run_tx(self.engine, work)
