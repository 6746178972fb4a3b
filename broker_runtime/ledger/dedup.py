"""De-dup state of idempotent consumption: CONSUMING with expiry, CONSUMED.

`claim` inserts CONSUMING if absent, or takes over a CONSUMING whose holder let it expire
(the holder died mid-effect); it reports CONSUMED or IN_PROGRESS otherwise. `finish` marks
CONSUMED for good; `release` deletes a CONSUMING after a failed attempt so a redelivery may
run again. Two stores: the ledger database (`consume_dedup`) and Redis (`SET NX PX`).
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Protocol

from sqlalchemy import Connection, Engine, bindparam, delete, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from broker_runtime.ledger.engine import open_ledger, run_tx
from broker_runtime.ledger.schema import DedupStatus, consume_dedup

DEFAULT_CONSUMED_TTL_MS = 7 * 24 * 3600 * 1000  # Redis only: how long CONSUMED is remembered


class Claim(StrEnum):
    ACQUIRED = "ACQUIRED"  # the caller now holds the message and runs the effect
    CONSUMED = "CONSUMED"  # the effect already happened: ack without running it
    IN_PROGRESS = "IN_PROGRESS"  # someone else holds it and has not expired: retry later


class DedupStore(Protocol):
    def claim(self, group: str, msg_id: str, now_ms: int, hold_ms: int) -> Claim:
        """Try to hold `msg_id` for `group` until `now_ms + hold_ms`."""
        ...

    def finish(self, group: str, msg_id: str, now_ms: int) -> None:
        """The effect is done: CONSUMED from now on."""
        ...

    def release(self, group: str, msg_id: str) -> None:
        """The attempt failed: forget the CONSUMING hold (a CONSUMED mark stays)."""
        ...


class SqlDedupStore:
    """`consume_dedup` in the ledger database; `now_ms` is the callers' clock."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        t = consume_dedup
        # Built once: statement construction costs more than a small SQLite transaction.
        insert = pg_insert if engine.dialect.name == "postgresql" else sqlite_insert
        key = (t.c.group == bindparam("b_group")) & (t.c.msg_id == bindparam("b_msg_id"))
        consuming = t.c.status == DedupStatus.CONSUMING.value
        self._insert = (
            insert(t)
            .values(
                group=bindparam("b_group"),
                msg_id=bindparam("b_msg_id"),
                status=DedupStatus.CONSUMING.value,
                expire_at=bindparam("b_expire"),
                updated_at=bindparam("b_now"),
            )
            .on_conflict_do_nothing()
            .returning(t.c.msg_id)
        )
        # Take over an expired hold; the WHERE is re-checked under the row lock, so of two
        # consumers racing for it only one updates the row.
        self._takeover = (
            update(t)
            .where(key & consuming & (t.c.expire_at <= bindparam("b_now")))
            .values(expire_at=bindparam("b_expire"), updated_at=bindparam("b_now"))
        )
        self._status = select(t.c.status, t.c.expire_at).where(key)
        upsert = insert(t).values(
            group=bindparam("b_group"),
            msg_id=bindparam("b_msg_id"),
            status=DedupStatus.CONSUMED.value,
            expire_at=None,
            updated_at=bindparam("b_now"),
        )
        self._finish = upsert.on_conflict_do_update(
            index_elements=["group", "msg_id"],
            set_={
                "status": upsert.excluded.status,
                "expire_at": None,
                "updated_at": upsert.excluded.updated_at,
            },
        )
        self._release = delete(t).where(key & consuming)

    @classmethod
    def open(cls, data_dir: Path | None, url: str | None = None) -> SqlDedupStore:
        """The table in the consumer ledger (`DIR/ledger/consumer.db`) or at `url`."""
        return cls(open_ledger(data_dir, "consumer", url))

    def claim(self, group: str, msg_id: str, now_ms: int, hold_ms: int) -> Claim:
        if hold_ms <= 0:
            raise ValueError(f"hold_ms must be > 0, got {hold_ms}")
        params = {
            "b_group": group,
            "b_msg_id": msg_id,
            "b_now": now_ms,
            "b_expire": now_ms + hold_ms,
        }

        def work(conn: Connection) -> Claim:
            if conn.execute(self._insert, params).first() is not None:
                return Claim.ACQUIRED
            if conn.execute(self._takeover, params).rowcount == 1:
                return Claim.ACQUIRED
            row = conn.execute(self._status, params).first()
            if row is None:  # released between our insert and our look: try again
                raise _Vanished
            return Claim.CONSUMED if row[0] == DedupStatus.CONSUMED else Claim.IN_PROGRESS

        for _ in range(3):
            try:
                return run_tx(self.engine, work)
            except _Vanished:
                continue
        return Claim.IN_PROGRESS

    def finish(self, group: str, msg_id: str, now_ms: int) -> None:
        params = {"b_group": group, "b_msg_id": msg_id, "b_now": now_ms}
        run_tx(self.engine, lambda conn: conn.execute(self._finish, params))

    def release(self, group: str, msg_id: str) -> None:
        params = {"b_group": group, "b_msg_id": msg_id}
        run_tx(self.engine, lambda conn: conn.execute(self._release, params))

    def close(self) -> None:
        """Close the pooled connections (the engine can be used again afterwards)."""
        self.engine.dispose()

    def status(self, group: str, msg_id: str) -> tuple[DedupStatus, int | None] | None:
        """(status, expire_at) of a message, or None when the table has no row for it."""
        params = {"b_group": group, "b_msg_id": msg_id}

        def work(conn: Connection) -> tuple[DedupStatus, int | None] | None:
            row = conn.execute(self._status, params).first()
            return None if row is None else (DedupStatus(row[0]), row[1])

        return run_tx(self.engine, work)


class _Vanished(Exception):
    """The row went away between the failed insert and the read (a concurrent release)."""
