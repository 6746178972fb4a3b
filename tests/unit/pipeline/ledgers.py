"""Ledger databases filled with test rows, in the tables broker_runtime.ledger.schema owns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, insert

from broker_runtime.ledger.schema import message_log, message_stub

__all__ = ["create", "execute", "log", "message_log", "message_stub", "stub", "url"]


def stub(i: int, status: str = "CONFIRMED") -> dict[str, Any]:
    return {
        "msg_id": f"UNIQ{i:08d}", "topic": f"Topic{i % 3}", "tags": f"tag{i % 3}",
        "keys": None if i % 2 else f"k{i}", "body_hash": f"{i:064x}", "status": status,
        "send_count": 1 + i % 3, "broker": "broker-a", "queue_id": i % 4, "queue_offset": i,
        "next_resend_at": None, "created_at": 1_700_000_000_000 + i,
        "updated_at": 1_700_000_000_500 + i, "system": "rocketmq", "routing_key": None,
        "headers": None, "return_reason": None,
    }  # fmt: skip


def log(i: int, outcome: str | None = "CONSUMED") -> dict[str, Any]:
    return {
        "msg_id": f"UNIQ{i:08d}", "topic": f"Topic{i % 3}", "group": "groupA",
        "client_id": f"client-{i % 2}", "broker": "broker-a", "queue_id": i % 4,
        "queue_offset": i, "reconsume_times": i % 3, "received_at": 1_700_000_001_000 + i,
        "outcome": outcome, "finished_at": None if outcome is None else 1_700_000_002_000 + i,
        "system": "rocketmq", "routing_key": None, "redelivered": None, "settle": None,
        "requeue": None, "death": None,
    }  # fmt: skip


def url(path: Path) -> str:
    return f"sqlite:///{path}"


def create(data_dir: Path, stubs: list[dict[str, Any]], logs: list[dict[str, Any]]) -> None:
    """DIR/ledger/producer.db (message_stub) and consumer.db (message_log), WAL mode."""
    (data_dir / "ledger").mkdir(parents=True, exist_ok=True)
    for name, table, rows in (
        ("producer.db", message_stub, stubs),
        ("consumer.db", message_log, logs),
    ):
        engine = create_engine(url(data_dir / "ledger" / name))
        with engine.begin() as conn:
            conn.exec_driver_sql("PRAGMA journal_mode=WAL")
            table.create(conn, checkfirst=True)
            if rows:
                conn.execute(insert(table), rows)
        engine.dispose()


def execute(db: Path, statement: Any) -> None:
    engine = create_engine(url(db))
    with engine.begin() as conn:
        conn.execute(statement)
    engine.dispose()
