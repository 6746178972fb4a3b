"""Finding brokers and ledgers in a data dir; checkpoint state and run plans (no Spark)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker_runtime.common.topics import InvalidNameError
from pipeline.jobs import ingest_state
from pipeline.readers.commitlog import Broker, plan_log
from pipeline.readers.layout import discover_brokers, ledger_sources
from tests.unit.pipeline.stores import SEG, varied, write_store


def test_brokers_from_the_directory_layout(tmp_path: Path) -> None:
    for group in ("broker-b", "broker-a"):
        for role in ("master", "slave"):
            (tmp_path / "brokers" / group / role).mkdir(parents=True)
    (tmp_path / "namesrv-0").mkdir()
    got = [(b.name, b.broker_id, Path(b.store_dir).name) for b in discover_brokers(tmp_path)]
    assert got == [
        ("broker-a", 0, "master"), ("broker-a", 1, "slave"),
        ("broker-b", 0, "master"), ("broker-b", 1, "slave"),
    ]  # fmt: skip


def test_brokers_from_cluster_json(tmp_path: Path) -> None:
    nodes = [
        {"role": "namesrv", "host": "127.0.0.1", "port": 9876},
        {
            "role": "slave",
            "broker": "broker-a",
            "broker_id": 1,
            "store_dir": "brokers/broker-a/slave",
        },
        {"role": "master", "broker": "broker-a", "broker_id": 0, "store_dir": str(tmp_path / "x")},
    ]
    (tmp_path / "cluster.json").write_text(json.dumps({"nodes": nodes}))
    got = discover_brokers(tmp_path)
    assert [(b.name, b.broker_id) for b in got] == [("broker-a", 0), ("broker-a", 1)]
    assert got[0].store_dir == str(tmp_path / "x")
    assert got[1].store_dir == str((tmp_path / "brokers" / "broker-a" / "slave").resolve())


def test_a_bare_store_dir_is_one_broker(tmp_path: Path) -> None:
    (tmp_path / "commitlog").mkdir()
    assert discover_brokers(tmp_path, "b1") == [Broker("b1", 0, str(tmp_path.resolve()))]
    with pytest.raises(FileNotFoundError):
        discover_brokers(tmp_path / "nope")


def test_ledger_sources(tmp_path: Path) -> None:
    assert ledger_sources(tmp_path) == ledger_sources(tmp_path, None)
    assert ledger_sources(tmp_path).message_stub is None
    (tmp_path / "ledger").mkdir()
    (tmp_path / "ledger" / "consumer.db").touch()
    s = ledger_sources(tmp_path)
    assert s.message_stub is None and s.message_log and s.message_log.endswith("consumer.db")
    pg = "postgresql+psycopg://u@127.0.0.1:5432/ledger"
    assert ledger_sources(tmp_path, pg) == type(s)(pg, pg)


def test_ranges_tile_the_log_from_the_checkpoint(tmp_path: Path) -> None:
    write_store(tmp_path / "s", varied(300))
    b = Broker("b", 0, str(tmp_path / "s"))
    plan = plan_log(b, 0, 10_000)
    assert plan.tasks[0].exact and plan.tasks[0].start == 0
    for t in plan.tasks:
        assert t.exact == (t.start == 0)  # split points need an anchor search
        assert t.stop - t.start <= 10_000 and t.file_from % SEG == 0
    resumed = plan_log(b, SEG + 5, 10_000, until=SEG + 20_000)
    assert resumed.tasks[0].file_from + resumed.tasks[0].start == SEG + 5
    assert resumed.plan_end == SEG + 20_000


def _row(run: int, status: str, source: str, nxt: int, end: int) -> dict[str, object]:
    return {"run": run, "status": status, "cluster": "c1", "broker": "b", "broker_id": 0,
            "store_dir": "/s",
            "source": source, "start_offset": 0, "plan_end": end, "next_offset": nxt}  # fmt: skip


def test_state_and_resume() -> None:
    log = ingest_state.COMMITLOG
    rows = [
        _row(1, "planned", log, 0, 100), _row(1, "done", log, 90, 100),
        _row(2, "planned", log, 90, 300),
    ]  # fmt: skip
    state = ingest_state.load_state(rows)
    assert state.last_run == 2 and state.next_offset == {
        ("c1", "b", 0, ingest_state.COMMITLOG): (90, 100)
    }
    plan = ingest_state.resume_plan(state, [])
    assert plan.resumed and plan.run == 2
    assert [(i.broker.replica, i.start, i.plan_end) for i in plan.items] == [
        (("c1", "b", 0), 0, 300)
    ]
    done = ingest_state.load_state([*rows, _row(2, "done", ingest_state.COMMITLOG, 300, 300)])
    assert done.unfinished == [] and done.next_offset[("c1", "b", 0, ingest_state.COMMITLOG)] == (
        300,
        300,
    )
    assert ingest_state.load_state([]) == ingest_state.State(0, [], {})


def test_broker_names_must_be_legal(tmp_path: Path) -> None:
    (tmp_path / "brokers" / "b'; drop" / "master").mkdir(parents=True)
    with pytest.raises(InvalidNameError):
        discover_brokers(tmp_path)
