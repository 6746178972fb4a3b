"""The official DefaultMQPushConsumer subscribed with MessageSelector.bySql against mqaudit's
broker: the broker filters on pull by the message properties (enablePropertyFilter on), each
consumer gets exactly the messages its expression matches, tag filtering keeps working beside
it, and an expression the broker cannot parse is refused with the position of the error."""

from __future__ import annotations

import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from broker_runtime.offsets.consumer_filters import read_consumer_filters
from tests.integration.cluster_fixtures import Cluster, running_cluster
from tests.interop.conftest import MQAUDIT_SETTINGS
from tests.interop.rocketmq import _java_env, java_argv
from tests.interop.test_java_clients import consume, produce

pytestmark = [pytest.mark.integration, pytest.mark.interop]

TOPIC = "SqlInterop"
# Runs of the official producer: (its arguments, the properties each of its messages has).
RUNS: dict[str, tuple[list[str], dict[str, str]]] = {
    "red": (["--count", "3", "--tags", "TagA", "--prop", "color=red", "--prop", "size=5"],
            {"color": "red", "size": "5"}),
    "blue": (["--count", "2", "--tags", "TagB", "--prop", "color=blue", "--prop", "size=12"],
             {"color": "blue", "size": "12"}),
    "plain": (["--count", "2", "--tags", "TagA"], {}),
}  # fmt: skip


@pytest.fixture(scope="module")
def cluster(interop_classpath: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    settings = {**MQAUDIT_SETTINGS, "enable_property_filter": "true"}
    data = tmp_path_factory.mktemp("sql")
    with running_cluster(data, name_servers=1, slaves=False, settings=settings) as c:
        yield c


@pytest.fixture(scope="module")
def sent(cluster: Cluster) -> dict[str, str]:
    """msgId -> the run that sent it."""
    out = {}
    for run, (args, _) in RUNS.items():
        for ack in produce(cluster.namesrv_addr, TOPIC, *args, "--keys", run):
            out[ack["msgId"]] = run
    return out


def _ids(got: list[dict[str, Any]]) -> Counter[str]:
    return Counter(r["msgId"] for r in got)


@pytest.mark.parametrize(
    ("group", "sql", "runs"),
    [
        ("j_sql_or", "color = 'red' OR size > 10", {"red", "blue"}),
        ("j_sql_between", "size BETWEEN 1 AND 6 AND TAGS = 'TagA'", {"red"}),
        ("j_sql_null", "color IS NULL", {"plain"}),
        ("j_sql_not_in", "color NOT IN ('red')", {"blue"}),  # null never matches
    ],
)
def test_each_sql_consumer_gets_exactly_the_messages_its_expression_matches(
    cluster: Cluster, sent: dict[str, str], group: str, sql: str, runs: set[str]
) -> None:
    want = Counter(m for m, run in sent.items() if run in runs)
    got = consume(
        cluster.namesrv_addr, group, TOPIC, "--sql", sql,
        "--expect", str(sum(want.values())), "--idle-ms", "8000",
    )  # fmt: skip
    assert _ids(got) == want
    for row in got:
        props = RUNS[sent[row["msgId"]]][1]
        assert {k: row["properties"].get(k) for k in props} == props


def test_mqaudits_broker_keeps_the_official_consumers_expression(
    cluster: Cluster, sent: dict[str, str]
) -> None:
    """consumerFilter.json on mqaudit's broker: the official consumer's expression, its
    subVersion (the client's clock when it subscribed) as clientVersion, dead once it left."""
    before = int(time.time() * 1000)
    got = consume(cluster.namesrv_addr, "j_sql_kept", TOPIC, "--sql", "size > 10",
                  "--expect", "2", "--idle-ms", "8000")  # fmt: skip
    assert _ids(got) == Counter(m for m, run in sent.items() if run == "blue")
    after = int(time.time() * 1000)
    store = cluster.store_dir("broker-a-master")
    deadline = time.monotonic() + 30
    while True:
        kept = {e.consumer_group: e for e in read_consumer_filters(store)}.get("j_sql_kept")
        if (kept is not None and kept.dead) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert kept is not None and kept.dead, kept
    assert (kept.topic, kept.expression, kept.expression_type) == (TOPIC, "size > 10", "SQL92")
    # A later heartbeat with a newer subVersion and the same expression keeps bornTime.
    assert before <= kept.born_time <= after and before <= kept.client_version <= after


def test_a_tag_consumer_beside_them_still_gets_its_tags(
    cluster: Cluster, sent: dict[str, str]
) -> None:
    want = Counter(m for m, run in sent.items() if run in ("red", "plain"))
    got = consume(cluster.namesrv_addr, "j_sql_tags", TOPIC, "--sub", "TagA",
                  "--expect", str(sum(want.values())), "--idle-ms", "8000")  # fmt: skip
    assert _ids(got) == want


def test_an_expression_the_broker_cannot_parse_is_refused_with_its_position(
    cluster: Cluster, sent: dict[str, str]
) -> None:
    """The broker refuses the expression with its position (SUBSCRIPTION_PARSE_FAILED, code
    23, on each pull); the official client logs the refusal and gets nothing. The program
    stays up on the client's own threads, so it is stopped here."""
    argv = java_argv("PushConsumer", "--namesrv", cluster.namesrv_addr, "--group", "j_sql_bad",
                     "--topic", TOPIC, "--sql", "color = ", "--idle-ms", "3000")  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_java_env())  # fmt: skip
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    assert "CODE: 23  DESC: subscription is illegal" in err, err[-3000:]
    assert "unexpected 'end of input' (line 1, column 9)" in err
    assert '"answer"' not in out  # nothing delivered
