"""`cluster up` when a port it picked is taken by the time its node binds it.

Ports are picked free just before a node starts, so another node (of this cluster or of one
started beside it) can bind the same port first. That node answers on the port; the new one
exits with EXIT_PORT_IN_USE and must be started again on new ports, not taken for answering.
Seen in CI: two masters of one cluster were handed the same port, and the second one's death
went unnoticed until the workload found it down.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_runtime.cluster import supervisor
from broker_runtime.cluster.layout import ClusterLayout
from broker_runtime.cluster.status import status as cluster_status
from broker_runtime.common.progress import show_progress
from tests.integration.cluster_fixtures import Cluster, kill_leftovers, running_cluster

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def other(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A cluster already running: its ports are the taken ones."""
    with running_cluster(tmp_path_factory.mktemp("other") / "c", name_servers=1, slaves=False) as c:
        yield c


def _taken_first(monkeypatch: pytest.MonkeyPatch, taken: list[int]) -> None:
    """free_port hands out `taken` first (in order), then free ports."""
    real = supervisor.free_port
    queue = list(taken)
    monkeypatch.setattr(supervisor, "free_port", lambda h: queue.pop(0) if queue else real(h))


def _up_and_check(data_dir: Path, other: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    """`up` succeeds after retrying one node on new ports, and both clusters stay up."""
    settings = supervisor.ClusterSettings(
        data_dir, name_servers=1, groups=("broker-a",), slaves=False, timeout_s=30.0
    )
    # What `mqaudit cluster up` does first: progress on stderr. The level is per process, and
    # an earlier test in this one may have run a command with --quiet.
    show_progress()
    try:
        layout = supervisor.up(settings)
        taken = {p for n in other.layout.nodes for p in (n.port, n.ha_port) if p}
        for n in layout.nodes:
            assert n.port not in taken and n.ha_port not in taken, n
            assert supervisor.process_alive(n), n.name
        assert all(supervisor.process_alive(n) for n in other.layout.nodes)
        status = cluster_status(ClusterLayout.load(data_dir))
        assert all(row["answering"] for row in status["nodes"]), status
        assert "broker-a-master: port taken, trying new ports (1/5)" in capsys.readouterr().err
    finally:
        kill_leftovers(data_dir)


def test_a_broker_handed_a_taken_port_is_started_again_on_new_ones(
    other: Cluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The name server gets a free port; the broker gets the running broker's port."""
    taken = other.layout.node("broker-a-master").port
    _taken_first(monkeypatch, [supervisor.free_port("127.0.0.1"), taken])
    _up_and_check(tmp_path / "c", other, capsys)


def test_a_master_handed_a_taken_ha_port_is_started_again(
    other: Cluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The remoting port is free and answers at once; the HA port (bound just after) is not."""
    free = [supervisor.free_port("127.0.0.1") for _ in range(2)]
    _taken_first(monkeypatch, [*free, other.layout.node("namesrv-0").port])
    _up_and_check(tmp_path / "c", other, capsys)
