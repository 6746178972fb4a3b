"""DLQ replay against a real cluster and a real lake: dry runs send nothing, nothing is
replayed twice unless forced, interrupted and failed runs resume without duplicates."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from broker_runtime.common.message import REPLAY_ID_PROPERTY
from pipeline.jobs.replay import plan_step, run_replay, send_step
from pipeline.remediation.replay_plan import replay_message
from pipeline.remediation.replay_request import ReplayRequest, parse_request
from pipeline.remediation.sender import BrokerClient, BrokerTarget
from pipeline.remediation.sends import SendInterrupted
from tests.dags.traffic import (
    copies_on_broker,
    ingest,
    make_dead_letters,
    replay_log,
    replays_on_broker,
)
from tests.integration.cluster_fixtures import Cluster, running_cluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TOPIC = "orders"


@dataclass
class World:
    cluster: Cluster
    lake: Path
    spark: Any
    dead: dict[str, list[str]]  # group -> UNIQ_KEYs of its dead letters

    @property
    def target(self) -> BrokerTarget:
        return BrokerTarget(self.cluster.namesrv_addr)

    def request(self, group: str, **kw: Any) -> ReplayRequest:
        return parse_request({"group": group, "from_time": 0, "dry_run": False, **kw})

    def log(self, group: str, replay_id: str | None = None) -> list[dict[str, Any]]:
        rows = [r for r in replay_log(self.spark, self.lake) if r["group"] == group]
        return [r for r in rows if replay_id is None or r["replay_id"] == replay_id]

    def replays(self, msg_id: str) -> list[Any]:
        return replays_on_broker(self.cluster.namesrv_addr, TOPIC, msg_id)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    from tests.conftest import local_spark

    root = tmp_path_factory.mktemp("replay")
    spark = local_spark()
    with running_cluster(root / "c", groups=("broker-a",), slaves=False, name_servers=1) as c:
        sizes = {"g-dry": 3, "g-twice": 2, "g-crash": 4, "g-down": 3, "g-other": 1}
        dead = {g: make_dead_letters(c.namesrv_addr, g, TOPIC, n) for g, n in sizes.items()}
        ingest(spark, root / "c", root / "lake")
        yield World(c, root / "lake", spark, dead)


def test_dry_run_logs_the_plan_and_sends_nothing(world: World) -> None:
    request = world.request("g-dry", dry_run=True)
    summary = run_replay(str(world.lake), request, "r-dry", None, spark=world.spark)
    assert summary["plan"]["planned"] == 3 and summary["by_status"] == {"planned": 3}
    assert {r["msg_id"] for r in world.log("g-dry")} == set(world.dead["g-dry"])
    assert all(r["reason"].startswith("dry run") for r in world.log("g-dry"))
    for msg_id in world.dead["g-dry"]:
        assert world.replays(msg_id) == []
    # ... and a real replay afterwards is not held back by the dry run.
    real = run_replay(
        str(world.lake), world.request("g-dry"), "r-dry-real", world.target, spark=world.spark
    )
    assert real["by_status"] == {"sent": 3}


def test_replayed_once_skipped_the_second_time_sent_again_when_forced(world: World) -> None:
    ids = world.dead["g-twice"]
    first = run_replay(
        str(world.lake), world.request("g-twice"), "r-1", world.target, spark=world.spark
    )
    assert first["by_status"] == {"sent": 2}
    sent = {r["msg_id"]: r for r in world.log("g-twice", "r-1") if r["status"] == "sent"}
    for msg_id in ids:
        (copy,) = world.replays(msg_id)
        assert copy.topic == TOPIC and copy.properties[REPLAY_ID_PROPERTY] == "r-1"
        assert copy.queue_offset == sent[msg_id]["new_offset"]
        assert copy.body == next(
            m.body for m in copies_on_broker(world.cluster.namesrv_addr, "%DLQ%g-twice", msg_id)
        )

    second = run_replay(
        str(world.lake), world.request("g-twice"), "r-2", world.target, spark=world.spark
    )
    assert second["by_status"] == {"skipped": 2} and second["send"]["sent"] == 0
    assert all("already replayed (by r-1" in r["reason"] for r in world.log("g-twice", "r-2"))
    assert all(len(world.replays(m)) == 1 for m in ids)

    forced = world.request("g-twice", force=True, msg_ids=[ids[0]])
    third = run_replay(str(world.lake), forced, "r-3", world.target, spark=world.spark)
    assert third["by_status"] == {"sent": 1}
    assert len(world.replays(ids[0])) == 2 and len(world.replays(ids[1])) == 1


def _crash_after_sending(world: World, request: ReplayRequest, replay_id: str, n: int) -> None:
    """What a run killed mid-send leaves: its plan logged, `n` messages sent, none logged."""
    plan = plan_step(str(world.lake), request, replay_id, target=world.target, spark=world.spark)
    assert plan["planned"] == len(world.dead[request.group])
    dlq = "%DLQ%" + request.group
    with BrokerClient(world.target, retry_times=0) as client:
        for msg_id in world.dead[request.group][:n]:
            (dead,) = copies_on_broker(world.cluster.namesrv_addr, dlq, msg_id)
            client.send(
                replay_message(
                    TOPIC, dead.body, dead.properties, msg_id, replay_id, dead.offset_msg_id
                )
            )


def test_an_interrupted_run_resumes_without_duplicates(world: World) -> None:
    request = world.request("g-crash")
    _crash_after_sending(world, request, "r-crash", 2)
    done = send_step(
        str(world.lake), request, "r-crash", world.target, resume=True, spark=world.spark
    )
    assert done["sent"] == 2 and done["failed"] == 0
    log = world.log("g-crash", "r-crash")
    found = [r for r in log if r["status"] == "sent" and "after an interrupted run" in r["reason"]]
    assert sorted(r["msg_id"] for r in found) == sorted(world.dead["g-crash"][:2])
    for msg_id in world.dead["g-crash"]:
        assert len(world.replays(msg_id)) == 1
    # A new run of the same request finds everything replayed.
    again = run_replay(str(world.lake), request, "r-crash-2", world.target, spark=world.spark)
    assert again["by_status"] == {"skipped": 4}


def test_a_new_run_settles_a_crashed_one_before_planning(world: World) -> None:
    request = world.request("g-other")
    _crash_after_sending(world, request, "r-lost", 1)
    summary = run_replay(str(world.lake), request, "r-after", world.target, spark=world.spark)
    assert summary["plan"]["settled"] == {"found_sent": 1, "not_stored": 0}
    assert summary["by_status"] == {"skipped": 1}
    assert len(world.replays(world.dead["g-other"][0])) == 1


def test_a_run_failing_while_the_broker_is_down_resumes_later(world: World) -> None:
    request = world.request("g-down")
    plan = plan_step(str(world.lake), request, "r-down", target=world.target, spark=world.spark)
    assert plan["planned"] == 3
    world.cluster.stop("broker-a-master")
    try:
        outcome = send_step(str(world.lake), request, "r-down", world.target, spark=world.spark)
        assert outcome["sent"] == 0 and outcome["failed"] == 3
    except SendInterrupted:
        pass
    finally:
        world.cluster.start("broker-a-master")
    failed = world.log("g-down", "r-down")
    assert sum(r["status"] == "failed" for r in failed) == 3
    done = send_step(
        str(world.lake), request, "r-down", world.target, resume=True, spark=world.spark
    )
    assert done["sent"] == 3
    for msg_id in world.dead["g-down"]:
        assert len(world.replays(msg_id)) == 1
