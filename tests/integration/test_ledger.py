"""Producer stubs and the consumer log, on SQLite (WAL) and on a real PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import BigInteger, Column, Integer, MetaData, Table, Text, insert, inspect
from sqlalchemy.exc import IntegrityError

from broker_runtime.common.clock import FakeClock
from broker_runtime.common.config import StoreConfig
from broker_runtime.common.message import KEYS, TAGS, UNIQ_KEY, Message
from broker_runtime.ledger.consumer import ConsumerLedger, LogError, Receipt
from broker_runtime.ledger.engine import (
    LedgerConfigError,
    create_ledger_engine,
    ensure_schema,
    normalize_url,
    open_ledger,
    resolve_url,
)
from broker_runtime.ledger.producer import (
    Confirmation,
    ProducerLedger,
    ResendBackoff,
    StubError,
    StubRecord,
    body_hash,
)
from broker_runtime.ledger.schema import Outcome, System, message_stub
from broker_runtime.store.message_store import MessageStore

T0 = 1_700_000_000_000
BACKOFF = ResendBackoff(first_ms=1000, factor=2.0, max_ms=5000)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def producer(ledger_url: str, clock: FakeClock) -> Iterator[ProducerLedger]:
    ledger = ProducerLedger.open(None, ledger_url, clock=clock, backoff=BACKOFF)
    yield ledger
    ledger.close()


@pytest.fixture
def consumer(ledger_url: str, clock: FakeClock) -> Iterator[ConsumerLedger]:
    ledger = ConsumerLedger.open(None, ledger_url, clock=clock)
    yield ledger
    ledger.close()


def stub(i: int) -> StubRecord:
    return StubRecord(f"U{i:04d}", "orders", body_hash(f"body {i}".encode()), "paid", f"order-{i}")


# -- the schema contract ------------------------------------------------------------------------


def test_tables_have_the_contracted_columns(ledger_url: str) -> None:
    engine = open_ledger(None, "producer", ledger_url)
    tables = ("message_stub", "message_log", "consume_dedup")
    columns = {t: [c["name"] for c in inspect(engine).get_columns(t)] for t in tables}
    assert columns == {
        "message_stub": ["msg_id", "topic", "tags", "keys", "body_hash", "status", "send_count",
                         "broker", "queue_id", "queue_offset", "next_resend_at", "created_at",
                         "updated_at", "system", "routing_key", "headers", "return_reason"],
        "message_log": ["id", "msg_id", "topic", "group", "client_id", "broker", "queue_id",
                        "queue_offset", "reconsume_times", "received_at", "outcome",
                        "finished_at", "system", "routing_key", "redelivered", "settle",
                        "requeue", "death"],
        "consume_dedup": ["group", "msg_id", "status", "expire_at", "updated_at"],
    }  # fmt: skip
    assert inspect(engine).get_pk_constraint("consume_dedup")["constrained_columns"] == [
        "group",
        "msg_id",
    ]
    ensure_schema(engine)  # a second time changes nothing
    engine.dispose()


def test_an_older_ledger_gains_the_added_columns(ledger_url: str) -> None:
    """A ledger made before the `system` column: opening it adds the columns, its rows are
    RocketMQ's, and new rows can say RabbitMQ."""
    old = MetaData()
    Table(
        "message_stub", old, Column("msg_id", Text, primary_key=True),
        Column("topic", Text, nullable=False), Column("tags", Text), Column("keys", Text),
        Column("body_hash", Text, nullable=False), Column("status", Text, nullable=False),
        Column("send_count", Integer, nullable=False), Column("broker", Text),
        Column("queue_id", Integer), Column("queue_offset", BigInteger),
        Column("next_resend_at", BigInteger), Column("created_at", BigInteger, nullable=False),
        Column("updated_at", BigInteger, nullable=False),
    )  # fmt: skip
    engine = create_ledger_engine(ledger_url)
    with engine.begin() as conn:
        old.create_all(conn)
        conn.execute(insert(old.tables["message_stub"]), {
            "msg_id": "OLD", "topic": "t", "body_hash": "h", "status": "CONFIRMED",
            "send_count": 1, "created_at": 1, "updated_at": 1,
        })  # fmt: skip
    engine.dispose()
    producer = ProducerLedger.open(None, ledger_url)
    new = StubRecord("NEW", "ex", "h", system=System.RABBITMQ, routing_key="a.b", headers="{}")
    producer.record_before_send([new])
    producer.mark_returned([("NEW", "NO_ROUTE")])
    old_row, new_row = producer.get("OLD"), producer.get("NEW")
    assert old_row is not None and new_row is not None
    assert (old_row["system"], old_row["routing_key"]) == ("rocketmq", None)
    assert (new_row["system"], new_row["routing_key"], new_row["return_reason"]) == (
        "rabbitmq", "a.b", "NO_ROUTE",
    )  # fmt: skip
    with pytest.raises(StubError, match="never recorded"):
        producer.mark_returned([("NOPE", "NO_ROUTE")])
    producer.close()


def test_the_database_refuses_an_unknown_status(ledger_url: str) -> None:
    engine = open_ledger(None, "producer", ledger_url)
    row = {"msg_id": "x", "topic": "t", "body_hash": "h", "status": "SENT", "send_count": 1,
           "created_at": 1, "updated_at": 1}  # fmt: skip
    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.execute(insert(message_stub), row)
    engine.dispose()


# -- producer stubs -----------------------------------------------------------------------------


def test_record_before_send(producer: ProducerLedger) -> None:
    assert producer.record_before_send([stub(1), stub(2)]) == []
    row = producer.get("U0001")
    assert row == {
        "msg_id": "U0001",
        "topic": "orders",
        "tags": "paid",
        "keys": "order-1",
        "body_hash": body_hash(b"body 1"),
        "status": "UNCONFIRMED",
        "send_count": 1,
        "broker": None,
        "queue_id": None,
        "queue_offset": None,
        "next_resend_at": T0 + 1000,
        "created_at": T0,
        "updated_at": T0,
        "system": "rocketmq",
        "routing_key": None,
        "headers": None,
        "return_reason": None,
    }


def test_recording_a_stub_again_changes_nothing_and_says_so(
    producer: ProducerLedger, clock: FakeClock
) -> None:
    producer.record_before_send([stub(1)])
    producer.confirm([Confirmation("U0001", "broker-a", 2, 40)])
    clock.advance(10)
    assert producer.record_before_send([stub(1), stub(3)]) == ["U0001"]
    row = producer.get("U0001")
    assert row is not None and row["status"] == "CONFIRMED" and row["updated_at"] == T0
    assert producer.get("U0003") is not None


def test_stub_of_a_message() -> None:
    msg = Message("orders", b"pay", {UNIQ_KEY: "U9", TAGS: "paid", KEYS: "o-9"})
    assert StubRecord.of(msg) == StubRecord("U9", "orders", body_hash(b"pay"), "paid", "o-9")
    with pytest.raises(ValueError, match="no UNIQ_KEY"):
        StubRecord.of(Message("orders", b"pay"))


def test_confirm_records_where_the_broker_stored_it(
    producer: ProducerLedger, clock: FakeClock
) -> None:
    producer.record_before_send([stub(i) for i in range(3)])
    producer.void(["U0002"])
    clock.advance(7)
    producer.confirm(
        [Confirmation("U0000", "broker-a", 1, 10), Confirmation("U0002", "broker-b", 0, 3)]
    )
    done, void = producer.get("U0000"), producer.get("U0002")
    assert done is not None and void is not None
    where = (done["status"], done["broker"], done["queue_id"], done["queue_offset"])
    assert where == ("CONFIRMED", "broker-a", 1, 10)
    assert done["next_resend_at"] is None and done["updated_at"] == T0 + 7
    assert void["status"] == "VOID" and void["queue_offset"] == 3
    pending = producer.get("U0001")
    assert pending is not None and pending["status"] == "UNCONFIRMED"


def test_confirming_an_unknown_stub_is_an_error_that_keeps_the_rest(
    producer: ProducerLedger,
) -> None:
    producer.record_before_send([stub(1)])
    with pytest.raises(StubError, match="never recorded") as err:
        producer.confirm(
            [Confirmation("nope", "broker-a", 0, 1), Confirmation("U0001", "broker-a", 0, 2)]
        )
    assert err.value.unknown == ["nope"]
    row = producer.get("U0001")
    assert row is not None and row["status"] == "CONFIRMED"


def test_resends_back_off_and_reopen_the_stub(producer: ProducerLedger, clock: FakeClock) -> None:
    producer.record_before_send([stub(1)])
    producer.confirm([Confirmation("U0001", "broker-a", 0, 5)])
    waits = []
    for n in range(2, 6):
        clock.advance(100)
        assert producer.mark_resent(["U0001"]) == {"U0001": n}
        row = producer.get("U0001")
        assert row is not None and row["status"] == "UNCONFIRMED" and row["send_count"] == n
        waits.append(row["next_resend_at"] - clock.now_ms())
    assert waits == [2000, 4000, 5000, 5000]  # doubling from 1 s, capped at 5 s


def test_backoff_rule() -> None:
    rule = ResendBackoff()
    assert [rule.delay_ms(n) for n in (1, 2, 3)] == [60_000, 120_000, 240_000]
    assert rule.delay_ms(7) == 3_600_000 and rule.delay_ms(100_000) == 3_600_000
    with pytest.raises(ValueError, match="starts at 1"):
        rule.delay_ms(0)


def test_resending_void_or_unknown_stubs_is_refused(producer: ProducerLedger) -> None:
    producer.record_before_send([stub(1), stub(2)])
    producer.void(["U0002"])
    with pytest.raises(StubError) as err:
        producer.mark_resent(["U0001", "U0002", "ghost"])
    assert (err.value.unknown, err.value.void) == (["ghost"], ["U0002"])
    row = producer.get("U0001")
    assert row is not None and row["send_count"] == 2  # the good one was still marked


def test_void_of_an_unknown_stub(producer: ProducerLedger) -> None:
    with pytest.raises(StubError, match="void"):
        producer.void(["ghost"])


def test_large_batches(producer: ProducerLedger) -> None:
    stubs = [stub(i) for i in range(1234)]
    assert producer.record_before_send(stubs) == []
    producer.confirm([Confirmation(s.msg_id, "broker-a", i % 4, i) for i, s in enumerate(stubs)])
    counts = producer.mark_resent([s.msg_id for s in stubs[:700]])
    assert set(counts.values()) == {2} and len(counts) == 700


# -- consumer log -------------------------------------------------------------------------------


def receipt(i: int, group: str = "pay_group") -> Receipt:
    return Receipt(f"U{i:04d}", "orders", group, "10.0.0.1@42", "broker-a", i % 4, i, 0)


def test_receipts_get_ids_in_order_and_outcomes(consumer: ConsumerLedger, clock: FakeClock) -> None:
    ids = consumer.record_received([receipt(i) for i in range(1100)])
    assert len(ids) == 1100 and ids == sorted(ids) and len(set(ids)) == 1100
    rows = {r["id"]: r for r in consumer.rows()}
    assert [rows[i]["queue_offset"] for i in ids] == list(range(1100))
    clock.advance(25)
    consumer.record_outcome([(ids[0], Outcome.CONSUMED), (ids[1], Outcome.RECONSUME_LATER)])
    first, second, third = (consumer.rows()[k] for k in range(3))
    assert (first["outcome"], first["received_at"]) == ("CONSUMED", T0)
    assert first["finished_at"] == T0 + 25
    assert second["outcome"] == "RECONSUME_LATER"
    assert third["outcome"] is None and third["finished_at"] is None


def test_every_delivery_is_its_own_row(consumer: ConsumerLedger) -> None:
    consumer.record_received([receipt(1)])
    consumer.record_received([receipt(1), receipt(1, group="audit_group")])
    assert [r["group"] for r in consumer.rows("U0001")] == ["pay_group", "pay_group", "audit_group"]


def test_bad_outcomes(consumer: ConsumerLedger) -> None:
    (i,) = consumer.record_received([receipt(1)])
    with pytest.raises(ValueError, match="DONE"):
        consumer.record_outcome([(i, "DONE")])  # type: ignore[list-item]
    with pytest.raises(LogError, match="999999"):
        consumer.record_outcome([(999_999, Outcome.CONSUMED), (i, Outcome.FAILED)])
    assert consumer.rows()[0]["outcome"] == "FAILED"


def test_receipt_of_a_stored_message(small_config: StoreConfig) -> None:
    with MessageStore(small_config) as store:
        retry = Message("%RETRY%pay_group", b"x", {UNIQ_KEY: "U7"}, reconsume_times=2)
        put = store.put_message(retry)
        stored = store.message_at(put.phys_offset)
        plain = store.message_at(store.put_message(Message("orders", b"y")).phys_offset)
    assert stored is not None and plain is not None
    r = Receipt.of(stored, "pay_group", "c1", "broker-a")
    assert r == Receipt("U7", "%RETRY%pay_group", "pay_group", "c1", "broker-a", 0, 0, 2)
    assert Receipt.of(plain, "pay_group", "c1", "broker-a").msg_id == plain.msg_id


# -- where the ledgers live ---------------------------------------------------------------------


def test_default_ledgers_are_sqlite_files_per_role(tmp_path: Path) -> None:
    producer = ProducerLedger.open(tmp_path)
    consumer = ConsumerLedger.open(tmp_path)
    producer.record_before_send([stub(1)])
    consumer.record_received([receipt(1)])
    assert (tmp_path / "ledger" / "producer.db").is_file()
    assert (tmp_path / "ledger" / "consumer.db").is_file()
    with producer.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30_000
    producer.close()
    consumer.close()
    path = (tmp_path / "ledger" / "consumer.db").resolve()
    assert resolve_url(tmp_path, "consumer") == f"sqlite:///{path}"


def test_urls() -> None:
    assert normalize_url("postgresql://u:pw@h:5/db") == "postgresql+psycopg://u:pw@h:5/db"
    assert normalize_url("postgres://h/db") == "postgresql+psycopg://h/db"
    assert resolve_url(None, "producer", "postgresql://h/db") == "postgresql+psycopg://h/db"
    bad_urls = ("mysql://h/db", "postgresql+psycopg2://h/db", "sqlite://", "sqlite:///:memory:")
    for bad in (*bad_urls, "nonsense"):
        with pytest.raises(LedgerConfigError):
            normalize_url(bad)
    with pytest.raises(LedgerConfigError) as err:
        normalize_url("mysql://u:secret@h/db")
    assert "secret" not in str(err.value)
    with pytest.raises(LedgerConfigError, match="data dir or a database URL"):
        resolve_url(None, "producer")
    with pytest.raises(LedgerConfigError, match="role"):
        resolve_url(Path("/tmp"), "broker")  # type: ignore[arg-type]
    with pytest.raises(LedgerConfigError, match="synchronous"):
        create_ledger_engine("sqlite:////tmp/never.db", sqlite_synchronous="SOMETIMES")
    assert not Path("/tmp/never.db").exists()
