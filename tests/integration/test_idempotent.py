"""Idempotent consumption over the ledger database (SQLite, PostgreSQL) and a real Redis."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from broker_runtime.client.idempotent import Idempotent, message_key, open_dedup_store
from broker_runtime.common.clock import FakeClock
from broker_runtime.ledger.dedup import Claim, DedupStore, SqlDedupStore
from broker_runtime.ledger.redis_dedup import RedisDedupStore
from broker_runtime.ledger.schema import DedupStatus

OK, LATER = "CONSUME_SUCCESS", "RECONSUME_LATER"
HOLD_MS = 300  # short, so that Redis's own expiry can be waited out


@dataclass(frozen=True)
class Delivery:
    uniq_key: str | None
    msg_id: str
    body: str = ""


@dataclass
class Backend:
    store: DedupStore
    clock: FakeClock
    expire: Callable[[int], None]  # let `ms` pass for the store's expiry


@pytest.fixture(
    params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration),
            pytest.param("redis", marks=pytest.mark.integration)],
)  # fmt: skip
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    clock = FakeClock(1_700_000_000_000)
    store: SqlDedupStore | RedisDedupStore
    if request.param == "redis":
        store = RedisDedupStore.from_url(request.getfixturevalue("redis_url"))

        def expire(ms: int) -> None:
            clock.advance(ms)
            time.sleep(ms / 1000)  # Redis times PX itself

    else:
        if request.param == "sqlite":
            url = f"sqlite:///{tmp_path / 'ledger' / 'consumer.db'}"
        else:
            url = request.getfixturevalue("postgres_url")
        store = SqlDedupStore.open(None, url)
        expire = clock.advance
    yield Backend(store, clock, expire)
    store.close()


def status(store: DedupStore, key: str, group: str = "g") -> DedupStatus | None:
    assert isinstance(store, SqlDedupStore | RedisDedupStore)
    got = store.status(group, key)
    return got[0] if isinstance(got, tuple) else got


# -- the store ----------------------------------------------------------------------------------


def test_claim_finish_release(backend: Backend) -> None:
    s, now = backend.store, backend.clock.now_ms
    assert s.claim("g", "m1", now(), HOLD_MS) is Claim.ACQUIRED
    assert status(s, "m1") is DedupStatus.CONSUMING
    assert s.claim("g", "m1", now(), HOLD_MS) is Claim.IN_PROGRESS
    s.finish("g", "m1", now())
    assert s.claim("g", "m1", now(), HOLD_MS) is Claim.CONSUMED
    s.release("g", "m1")  # a late release never erases CONSUMED
    assert status(s, "m1") is DedupStatus.CONSUMED
    backend.expire(HOLD_MS + 100)  # CONSUMED does not expire with the hold
    assert s.claim("g", "m1", now(), HOLD_MS) is Claim.CONSUMED


def test_a_released_claim_can_be_taken_again(backend: Backend) -> None:
    s, now = backend.store, backend.clock.now_ms
    assert s.claim("g", "m1", now(), HOLD_MS) is Claim.ACQUIRED
    s.release("g", "m1")
    assert status(s, "m1") is None
    assert s.claim("g", "m1", now(), HOLD_MS) is Claim.ACQUIRED


def test_an_expired_hold_is_taken_over(backend: Backend) -> None:
    s, now = backend.store, backend.clock.now_ms
    assert s.claim("g", "m1", now(), HOLD_MS) is Claim.ACQUIRED
    backend.expire(HOLD_MS // 3)
    assert s.claim("g", "m1", now(), HOLD_MS) is Claim.IN_PROGRESS
    backend.expire(HOLD_MS)
    assert s.claim("g", "m1", now(), HOLD_MS) is Claim.ACQUIRED
    assert s.claim("g", "m1", now(), HOLD_MS) is Claim.IN_PROGRESS  # the new hold counts


def test_groups_are_independent(backend: Backend) -> None:
    s, now = backend.store, backend.clock.now_ms
    assert s.claim("g1", "m1", now(), HOLD_MS) is Claim.ACQUIRED
    s.finish("g1", "m1", now())
    assert s.claim("g2", "m1", now(), HOLD_MS) is Claim.ACQUIRED


def test_bad_hold(backend: Backend) -> None:
    with pytest.raises(ValueError, match="hold_ms"):
        backend.store.claim("g", "m1", backend.clock.now_ms(), 0)


def test_sql_rows_and_redis_ttls(backend: Backend) -> None:
    s, now = backend.store, backend.clock.now_ms()
    s.claim("g", "m1", now, HOLD_MS)
    if isinstance(s, SqlDedupStore):
        assert s.status("g", "m1") == (DedupStatus.CONSUMING, now + HOLD_MS)
        s.finish("g", "m1", now + 5)
        assert s.status("g", "m1") == (DedupStatus.CONSUMED, None)
    else:
        assert isinstance(s, RedisDedupStore)
        assert 0 < s.client.pttl(s.key("g", "m1")) <= HOLD_MS
        s.finish("g", "m1", now)
        assert s.client.pttl(s.key("g", "m1")) > HOLD_MS * 1000


# -- the wrapper --------------------------------------------------------------------------------


class Effects:
    """A consume callback that records each effect and answers from a script."""

    def __init__(self, answers: dict[str, list[object]] | None = None) -> None:
        self.done: list[str] = []
        self.answers = answers or {}

    def __call__(self, msg: Delivery) -> str:
        script = self.answers.get(msg.body)
        answer = script.pop(0) if script else OK
        if isinstance(answer, Exception):
            raise answer
        if answer == OK:
            self.done.append(msg.msg_id)
        return str(answer)


def wrap(backend: Backend, effects: Effects) -> Idempotent[Delivery, str]:
    return Idempotent(
        effects, backend.store, "pay_group", success=OK, later=LATER,
        hold_ms=HOLD_MS, clock=backend.clock,
    )  # fmt: skip


def test_duplicate_deliveries_run_the_effect_once(backend: Backend) -> None:
    effects = Effects()
    consume = wrap(backend, effects)
    first = Delivery("U1", "OFFSET-A")
    resent = Delivery("U1", "OFFSET-B")  # the producer's resend: same UNIQ_KEY, new copy
    assert [consume(m) for m in (first, first, resent, first)] == [OK] * 4
    assert effects.done == ["OFFSET-A"]
    assert (consume.stats.ran, consume.stats.skipped, consume.stats.deferred) == (1, 3, 0)


def test_a_failure_leaves_the_message_to_be_consumed_again(backend: Backend) -> None:
    effects = Effects({"flaky": [LATER, RuntimeError("db down"), OK]})
    consume = wrap(backend, effects)
    msg = Delivery("U2", "OFF", "flaky")
    assert consume(msg) == LATER
    with pytest.raises(RuntimeError, match="db down"):
        consume(msg)
    assert consume(msg) == OK
    assert consume(msg) == OK
    assert effects.done == ["OFF"]
    assert consume.stats.ran == 3 and consume.stats.skipped == 1


def test_a_duplicate_while_the_first_is_running_comes_back_later(backend: Backend) -> None:
    started, release = threading.Event(), threading.Event()
    effects = Effects()

    def slow(msg: Delivery) -> str:
        started.set()
        assert release.wait(10)
        return effects(msg)

    consume = Idempotent(slow, backend.store, "pay_group", success=OK, later=LATER,
                         hold_ms=60_000, clock=backend.clock)  # fmt: skip
    msg = Delivery("U3", "OFF")
    results: list[str] = []
    worker = threading.Thread(target=lambda: results.append(consume(msg)))
    worker.start()
    assert started.wait(10)
    assert consume(msg) == LATER  # the duplicate does not run the effect a second time
    release.set()
    worker.join(10)
    assert results == [OK] and effects.done == ["OFF"]
    assert consume(msg) == OK and consume.stats.deferred == 1


def test_a_consumer_that_died_mid_effect_is_taken_over_after_the_hold(backend: Backend) -> None:
    # The dead consumer claimed the message and never finished or released it.
    assert backend.store.claim("pay_group", "U4", backend.clock.now_ms(), HOLD_MS) is Claim.ACQUIRED
    effects = Effects()
    consume = wrap(backend, effects)
    msg = Delivery("U4", "OFF")
    assert consume(msg) == LATER
    backend.expire(HOLD_MS + 50)
    assert consume(msg) == OK
    assert effects.done == ["OFF"]


def test_messages_without_uniq_key_use_the_offset_id() -> None:
    assert message_key(Delivery(None, "OFFSET")) == "OFFSET"
    assert message_key(Delivery("U", "OFFSET")) == "U"


def test_wrapper_arguments(backend: Backend) -> None:
    with pytest.raises(ValueError, match="hold_ms"):
        Idempotent(Effects(), backend.store, "g", success=OK, later=LATER, hold_ms=0)


def test_open_dedup_store_picks_the_backend(tmp_path: Path) -> None:
    sql = open_dedup_store(tmp_path)
    assert isinstance(sql, SqlDedupStore)
    assert str(sql.engine.url).endswith("ledger/consumer.db")
    sql.close()


@pytest.mark.integration
def test_open_dedup_store_with_redis(redis_url: str) -> None:
    store = open_dedup_store(None, redis_url=redis_url)
    assert isinstance(store, RedisDedupStore)
    assert store.claim("g", "m", 0, HOLD_MS) is Claim.ACQUIRED
    store.close()
