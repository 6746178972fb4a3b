"""Ledger databases as the BRIEF's shared contract defines them, for testing the reader
(the writer's own module may not exist on this branch: these definitions are the contract)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import BigInteger, Column, Integer, MetaData, Table, Text, create_engine, insert

metadata = MetaData()
message_stub = Table(
    "message_stub",
    metadata,
    Column("msg_id", Text, primary_key=True),
    Column("topic", Text, nullable=False),
    Column("tags", Text),
    Column("keys", Text),
    Column("body_hash", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("send_count", Integer, nullable=False),
    Column("broker", Text),
    Column("queue_id", Integer),
    Column("queue_offset", BigInteger),
    Column("next_resend_at", BigInteger),
    Column("created_at", BigInteger, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
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
    Column("outcome", Text),
    Column("finished_at", BigInteger),
)


def stub(i: int, status: str = "CONFIRMED") -> dict[str, Any]:
    return {
        "msg_id": f"UNIQ{i:08d}", "topic": f"Topic{i % 3}", "tags": f"tag{i % 3}",
        "keys": None if i % 2 else f"k{i}", "body_hash": f"{i:064x}", "status": status,
        "send_count": 1 + i % 3, "broker": "broker-a", "queue_id": i % 4, "queue_offset": i,
        "next_resend_at": None, "created_at": 1_700_000_000_000 + i,
        "updated_at": 1_700_000_000_500 + i,
    }  # fmt: skip


def log(i: int, outcome: str | None = "CONSUMED") -> dict[str, Any]:
    return {
        "msg_id": f"UNIQ{i:08d}", "topic": f"Topic{i % 3}", "group": "groupA",
        "client_id": f"client-{i % 2}", "broker": "broker-a", "queue_id": i % 4,
        "queue_offset": i, "reconsume_times": i % 3, "received_at": 1_700_000_001_000 + i,
        "outcome": outcome, "finished_at": None if outcome is None else 1_700_000_002_000 + i,
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
