"""Ledger database engines: a SQLite file per role under DIR/ledger/, or PostgreSQL by URL.

Several processes write one SQLite file at once (producers, consumers, the pipeline), so each
connection runs in WAL mode with a busy timeout, and every transaction starts with
`BEGIN IMMEDIATE`: it takes the write lock up front, waiting up to the busy timeout, instead of
failing at once when a read transaction later tries to write. What still fails with "database
is locked", and PostgreSQL's serialization failures and deadlocks, `run_tx` retries.
With `synchronous=NORMAL` (the default) a commit survives the death of the process, not a
power cut; pass "FULL" for that. Engines must not be shared across fork().
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError

from broker_runtime.ledger.schema import metadata

Role = Literal["producer", "consumer"]
ROLES: tuple[Role, ...] = ("producer", "consumer")
LEDGER_DIR = "ledger"
DEFAULT_BUSY_TIMEOUT_MS = 30_000
SQLITE_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
_RETRY_SQLSTATES = {"40001", "40P01"}  # serialization_failure, deadlock_detected
_SCHEMA_LOCK_KEY = 0x6D7161756469  # pg_advisory_xact_lock key while creating tables ("mqaudi")

T = TypeVar("T")
IN_LIST_CHUNK = 500  # ids per `IN (...)`, well below SQLite's bound-parameter limit


class LedgerConfigError(ValueError):
    """A ledger URL or setting the ledger cannot use."""


def sqlite_path(data_dir: Path, role: Role) -> Path:
    """`DIR/ledger/{role}.db`."""
    if role not in ROLES:
        raise LedgerConfigError(f"ledger role must be one of {ROLES}, got {role!r}")
    return Path(data_dir) / LEDGER_DIR / f"{role}.db"


def resolve_url(data_dir: Path | None, role: Role, url: str | None = None) -> str:
    """The database URL of a role: `url` when given (PostgreSQL or SQLite), else its SQLite file."""
    if url:
        return normalize_url(url)
    if data_dir is None:
        raise LedgerConfigError("a ledger needs a data dir or a database URL")
    path = sqlite_path(data_dir, role).resolve()
    return f"sqlite:///{path}"


def normalize_url(url: str) -> str:
    """Accept sqlite and PostgreSQL URLs; plain `postgresql://` means the psycopg 3 driver."""
    try:
        parsed = make_url(url)
    except ArgumentError as e:
        raise LedgerConfigError(f"not a database URL: {url!r} ({e})") from None
    backend, _, driver = parsed.drivername.partition("+")
    if backend == "postgres":
        backend = "postgresql"
    if backend == "postgresql" and driver in ("", "psycopg"):
        return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    if backend == "sqlite" and driver in ("", "pysqlite"):
        if not parsed.database or parsed.database == ":memory:":
            raise LedgerConfigError("a SQLite ledger needs a file (processes share it)")
        return url
    raise LedgerConfigError(
        f"ledger URL {parsed.render_as_string()!r}: use sqlite:///FILE or postgresql+psycopg://..."
    )


def create_ledger_engine(
    url: str,
    *,
    busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
    sqlite_synchronous: str = "NORMAL",
) -> Engine:
    """An engine for `url` (see module doc for the SQLite settings); tables are not created."""
    url = normalize_url(url)
    if url.startswith("postgresql"):
        return create_engine(url)
    if sqlite_synchronous.upper() not in SQLITE_SYNCHRONOUS:
        raise LedgerConfigError(f"sqlite_synchronous must be one of {SQLITE_SYNCHRONOUS}")
    database = make_url(url).database
    assert database is not None  # normalize_url refused URLs without a file
    Path(database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url)

    @event.listens_for(engine, "connect")
    def _configure(dbapi_conn: sqlite3.Connection, _record: Any) -> None:
        # Let SQLAlchemy's BEGIN below, not pysqlite's implicit one, open transactions.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        cur.execute("PRAGMA journal_mode = WAL")
        cur.execute(f"PRAGMA synchronous = {sqlite_synchronous.upper()}")
        cur.execute("PRAGMA foreign_keys = ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def ensure_schema(engine: Engine) -> None:
    """Create the ledger tables that are missing and add the columns an older ledger lacks
    (tables only ever gain nullable or defaulted columns); safe when several processes race
    to do it."""

    def create(conn: Connection) -> None:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _SCHEMA_LOCK_KEY})
        metadata.create_all(conn, checkfirst=True)
        look = inspect(conn)
        for table in metadata.sorted_tables:
            have = {c["name"] for c in look.get_columns(table.name)}
            for column in table.columns:
                if column.name not in have:
                    _add_column(conn, table.name, column)

    run_tx(engine, create)


def _add_column(conn: Connection, table: str, column: Any) -> None:
    prep = conn.dialect.identifier_preparer
    kind = column.type.compile(dialect=conn.dialect)
    default = column.server_default
    tail = ""
    if default is not None:
        tail = f" NOT NULL DEFAULT {default.arg.text}" if not column.nullable else ""
        tail = tail or f" DEFAULT {default.arg.text}"
    conn.exec_driver_sql(
        f"ALTER TABLE {prep.quote(table)} ADD COLUMN {prep.quote(column.name)} {kind}{tail}"
    )


def open_ledger(
    data_dir: Path | None, role: Role, url: str | None = None, **engine_options: Any
) -> Engine:
    """The engine of a role's ledger, its tables created if missing."""
    engine = create_ledger_engine(resolve_url(data_dir, role, url), **engine_options)
    ensure_schema(engine)
    return engine


def is_transient(error: DBAPIError) -> bool:
    """A lock or serialization conflict that the same transaction may pass when retried."""
    orig = error.orig
    if isinstance(orig, sqlite3.OperationalError):
        message = str(orig).lower()
        return "locked" in message or "busy" in message
    return getattr(orig, "sqlstate", None) in _RETRY_SQLSTATES


def run_tx(
    engine: Engine, work: Callable[[Connection], T], *, attempts: int = 8, pause_s: float = 0.05
) -> T:
    """Run `work` in one transaction, again from the start after a transient conflict."""
    for attempt in range(1, attempts + 1):
        try:
            with engine.begin() as conn:
                return work(conn)
        except DBAPIError as e:
            if attempt == attempts or not is_transient(e):
                raise
            time.sleep(pause_s * attempt)
    raise AssertionError("unreachable")  # the loop returns or raises


def chunks(items: Sequence[T], size: int = IN_LIST_CHUNK) -> Iterator[Sequence[T]]:
    """`items` in slices of at most `size` (for `IN (...)` lists)."""
    for i in range(0, len(items), size):
        yield items[i : i + size]
