"""What `mqaudit produce` and `mqaudit consume` say when the cluster does not do what was
asked: an ACL refusal, queues stuck at a damaged unit, sends stored without a replica.

Before: a refused consumer printed {"consumed": 0} and exited 0 (the reason only in the
broker's log), a consume stuck at a damaged unit likewise, and a produce counted
SLAVE_NOT_AVAILABLE answers as sent and exited 0.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator

import pytest

from broker_runtime.remoting.protocol import ResponseCode as R
from tests.conftest import mqaudit_cmd
from tests.integration.cluster_fixtures import Cluster, RawClient, running_cluster
from tests.integration.test_cluster_acl import ACCOUNTS, ADMIN, CONSUMER, PRODUCER

pytestmark = pytest.mark.integration

BODY_AT = 88  # a message unit's body starts this far into it (after its 4-byte length)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("refusals")
    acl = root / "acl.json"
    acl.write_text(json.dumps(ACCOUNTS))
    with running_cluster(
        root / "c", name_servers=1, flush="sync", replication="sync", acl=acl
    ) as c:
        yield c


def cli(c: Cluster, *args: str, creds: tuple[str, str] | None) -> subprocess.CompletedProcess[str]:
    argv = [*args, "--namesrv", c.namesrv_addr]
    if creds is not None:
        argv += ["--access-key", creds[0], "--secret-key", creds[1]]
    return subprocess.run(mqaudit_cmd(*argv), capture_output=True, text=True, timeout=120)


def summary(out: subprocess.CompletedProcess[str]) -> dict[str, object]:
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def consume(c: Cluster, group: str, topic: str, creds: tuple[str, str] | None, *more: str):  # type: ignore[no-untyped-def]
    return cli(
        c, "consume", "--group", group, "--topic", topic, "--timeout", "3", *more, creds=creds
    )


def test_produce_reports_each_send_status(cluster: Cluster) -> None:
    out = cli(cluster, "produce", "--topic", "AclTopic", "--count", "10", creds=PRODUCER)
    assert out.returncode == 0, out.stderr[-2000:]
    assert summary(out) == {"sent": 10, "failed": 0, "statuses": {"SEND_OK": 10}}


@pytest.mark.parametrize(
    ("creds", "reason"),
    [
        (None, "not signed"),
        ((CONSUMER[0], "wrong-secret"), "signature check failed"),
        (PRODUCER, "no SUB permission"),
    ],
    ids=["no-credentials", "wrong-secret", "no-sub-permission"],
)
def test_a_refused_consumer_fails_with_the_reason(
    cluster: Cluster, creds: tuple[str, str] | None, reason: str
) -> None:
    out = consume(cluster, "AclGroup", "AclTopic", creds)
    assert out.returncode == 1, (out.returncode, out.stdout, out.stderr[-2000:])
    assert reason in out.stderr, out.stderr[-2000:]
    assert reason in str(summary(out)["refused"])


def test_a_permitted_consumer_consumes(cluster: Cluster) -> None:
    out = consume(cluster, "AclGroup", "AclTopic", CONSUMER, "--count", "10")
    assert out.returncode == 0, out.stderr[-2000:]
    assert summary(out) == {"consumed": 10, "unique": 10}


def test_a_consume_stuck_at_a_damaged_unit_fails_and_names_the_queue(cluster: Cluster) -> None:
    master = cluster.addr("broker-a-master")

    async def send() -> list[int]:
        client = RawClient(ADMIN)
        try:
            offsets = []
            for i in range(3):
                r = await client.send(master, "StuckTopic", b"stuck-%d" % i, 0)
                assert r.code == R.SUCCESS, r.remark
                offsets.append(int(r.ext_fields["physOffset"]))
            return offsets
        finally:
            await client.close()

    phys = asyncio.run(send())[1]
    segment = 1 << 20  # running_cluster's segment size
    path = cluster.store_dir("broker-a-master") / "commitlog" / f"{phys // segment * segment:020d}"
    with open(path, "r+b") as f:  # the broker maps this file shared: it reads the flip
        f.seek(phys % segment + BODY_AT)
        byte = f.read(1)
        f.seek(phys % segment + BODY_AT)
        f.write(bytes([byte[0] ^ 0xFF]))
    out = consume(cluster, "StuckGroup", "StuckTopic", ADMIN)
    assert out.returncode == 1, (out.stdout, out.stderr[-2000:])
    result = summary(out)
    assert result["consumed"] == 1, result  # the broker serves the unit before the damage
    stuck = result["stuck"]
    assert isinstance(stuck, list) and len(stuck) == 1, result
    assert stuck[0]["queue"].endswith(":0") and stuck[0]["offset"] == 1, stuck
    assert stuck[0]["max_offset"] == 3, stuck  # the broker holds the pull at the damage
    assert "stuck" in out.stderr


def test_produce_fails_when_sends_are_not_replicated(cluster: Cluster) -> None:
    cluster.stop("broker-a-slave")
    out = cli(cluster, "produce", "--topic", "AclTopic", "--count", "5", creds=PRODUCER)
    assert out.returncode == 1, out.stderr[-2000:]
    assert summary(out) == {"sent": 5, "failed": 0, "statuses": {"SLAVE_NOT_AVAILABLE": 5}}
