"""CLI helpers of the client commands, and where a group without an offset starts."""

from __future__ import annotations

import asyncio
import io
import logging
from pathlib import Path

import pytest

from broker_runtime.cli.client_args import print_table
from broker_runtime.cli.produce_cmd import body_of
from broker_runtime.client.config import ClientConfig, parse_namesrv
from broker_runtime.client.consumer_options import ConsumerOptions
from broker_runtime.client.model import ConsumeFromWhere
from broker_runtime.client.offset_store import NO_OFFSET, ReadType
from broker_runtime.client.push_consumer import PushConsumer
from broker_runtime.client.rebalance import MessageQueue
from broker_runtime.cluster.layout import ClusterLayout, NodeSpec, namesrv_of_data_dir
from broker_runtime.common.clock import format_ms, parse_time_ms
from broker_runtime.common.progress import counter, log_progress, reporter, show_progress


def test_namesrv_of_data_dir_reads_cluster_json(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"cluster\.json not found"):
        namesrv_of_data_dir(tmp_path)
    nodes = [
        NodeSpec(f"namesrv-{i}", "namesrv", "127.0.0.1", 9876 + i, "d", "l", []) for i in range(2)
    ] + [NodeSpec("broker-a-master", "master", "127.0.0.1", 10911, "d", "l", [], "broker-a", 0)]
    ClusterLayout(str(tmp_path), nodes=nodes).save()
    assert namesrv_of_data_dir(tmp_path) == "127.0.0.1:9876;127.0.0.1:9877"


def test_name_server_lists_and_client_ids() -> None:
    assert parse_namesrv(" a:1; b:2 ,c:3 ") == ["a:1", "b:2", "c:3"]
    for bad in ("", "a", "a:b", ";"):
        with pytest.raises(ValueError):
            parse_namesrv(bad)
    cfg = ClientConfig("h:1", client_ip="10.0.0.7")
    assert cfg.client_id(unique=False) == "10.0.0.7@DEFAULT"
    a, b = cfg.client_id(), cfg.client_id()
    assert a != b and a.startswith("10.0.0.7@")  # two clients in one process: two members
    assert ClientConfig("h:1", client_ip="x", instance_name="i1").client_id() == "x@i1"
    with pytest.raises(ValueError, match="both"):
        ClientConfig("h:1", access_key="ak")


def test_times_tables_and_bodies() -> None:
    assert parse_time_ms("1700000000123") == 1_700_000_000_123
    assert parse_time_ms("2023-11-14T22:13:20") == 1_700_000_000_000
    assert parse_time_ms("2023-11-14T23:13:20+01:00") == 1_700_000_000_000
    with pytest.raises(ValueError, match="ISO"):
        parse_time_ms("yesterday")
    assert format_ms(1_700_000_000_123) == "2023-11-14 22:13:20,123"
    assert format_ms(0) == "-"
    assert body_of(7, 12) == b"msg-7:xxxxxx" and body_of(12345, 3) == b"msg"


def test_print_table_aligns_columns(capsys: pytest.CaptureFixture[str]) -> None:
    print_table(["#A", "#Long header"], [["x", 1], ["yyyy", 22]])
    assert capsys.readouterr().out.splitlines() == ["#A    #Long header", "x     1", "yyyy  22"]


def test_a_counter_writes_lines_when_not_a_terminal() -> None:
    out = io.StringIO()
    with counter("sent", 10, out) as count:
        count.update(1, "first")
        count.update(2, "skipped")  # within the interval
        count.update(10, "last")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].endswith("sent 1/10 first") and lines[1].endswith("sent 10/10 last")


def test_a_counter_draws_a_progress_display_on_a_terminal() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    with counter("consumed", None, out) as count:
        count.update(7, "unique 7")
    assert "consumed" in out.getvalue() and "unique 7" in out.getvalue()


def test_progress_records_show_on_stderr_as_step_lines(
    capsys: pytest.CaptureFixture[str],
) -> None:
    show_progress()
    reporter("ingest")("2 broker store dir(s)")
    reporter("audit", enabled=False)("not shown")
    assert capsys.readouterr().err == "ingest: 2 broker store dir(s)\n"


def test_inside_a_task_progress_records_go_to_the_hosts_handlers_at_info(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An Airflow task logs its stderr as errors: there the records go to the host's logging
    instead (its root's handlers), once each, at their own level, even after a command's
    `show_progress` in the same process."""
    seen: list[logging.LogRecord] = []
    host = logging.Handler()
    host.emit = seen.append  # type: ignore[method-assign]
    root = logging.getLogger()
    root.addHandler(host)
    try:
        show_progress()
        log_progress()
        reporter("gate")("messages: passed 25 expectations")
    finally:
        root.removeHandler(host)
    assert capsys.readouterr().err == ""
    assert [(r.name, r.levelname, r.getMessage()) for r in seen] == [
        ("mqaudit.gate", "INFO", "messages: passed 25 expectations")
    ]


MQ = MessageQueue("T", "broker-a", 0)


@pytest.mark.parametrize(
    ("where", "stored", "topic", "expected"),
    [
        (ConsumeFromWhere.LAST_OFFSET, 7, "T", 7),  # a committed offset always wins
        (ConsumeFromWhere.LAST_OFFSET, NO_OFFSET, "T", 100),  # max offset
        (ConsumeFromWhere.FIRST_OFFSET, NO_OFFSET, "T", 0),
        (ConsumeFromWhere.TIMESTAMP, NO_OFFSET, "T", 42),  # searched by time
        (ConsumeFromWhere.LAST_OFFSET, NO_OFFSET, "%RETRY%g", 0),  # retry topics from 0
        (ConsumeFromWhere.TIMESTAMP, NO_OFFSET, "%RETRY%g", 100),
    ],
)
def test_where_a_queue_without_offset_starts(
    where: ConsumeFromWhere, stored: int, topic: str, expected: int
) -> None:
    consumer = PushConsumer(
        "127.0.0.1:1",
        "g",
        lambda m, c: None,
        options=ConsumerOptions(consume_from=where, consume_timestamp_ms=5),
    )
    searched: list[int] = []

    async def read(mq: MessageQueue, how: ReadType) -> int:
        assert how is ReadType.STORE
        return stored

    async def max_offset(mq: MessageQueue) -> int:
        return 100

    async def search(mq: MessageQueue, ts: int) -> int:
        searched.append(ts)
        return 42

    consumer.offset_store.read = read  # type: ignore[method-assign]
    consumer.max_offset = max_offset  # type: ignore[method-assign]
    consumer.search_offset = search  # type: ignore[method-assign]
    mq = MessageQueue(topic, "broker-a", 0)
    assert asyncio.run(consumer.compute_pull_from(mq)) == expected
    assert searched == ([5] if expected == 42 else [])
