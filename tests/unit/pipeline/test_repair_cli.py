"""`mqaudit pipeline repair` (and a RabbitMQ `replay`) refuses bad input with one clear message,
before Spark starts and before anything is read, written or sent."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_runtime.cli.main import main


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--rate", "0", "--max-messages", "0"], "bad repair parameters"),
        (["--no-dry-run"], "a real repair needs --namesrv or a --data-dir with cluster.json"),
        ([], "no producer ledger in"),
    ],
)
def test_bad_repairs_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], needle: str
) -> None:
    lake = tmp_path / "lake"
    lake.mkdir()
    code = main(["pipeline", "repair", "--lake", str(lake), "--data-dir", str(tmp_path), *extra])
    assert code == 2 and needle in capsys.readouterr().err
    assert list(lake.iterdir()) == []  # nothing written


def test_a_missing_lake_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["pipeline", "repair", "--lake", str(tmp_path / "none"), "--data-dir", "."])
    assert code == 2 and "does not exist (ingest and audit the cluster first)" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--no-dry-run"], "a real replay needs --rabbit-url"),
        (["--topic", "x" * 300], "topic: at most 255 bytes"),
    ],
)
def test_bad_rabbitmq_replays_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], needle: str
) -> None:
    lake = tmp_path / "lake"
    lake.mkdir()
    argv = ["pipeline", "replay", "--lake", str(lake), "--system", "rabbitmq", "--group",
            "orders.work", "--from", "0", *extra]  # fmt: skip
    assert main(argv) == 2 and needle in capsys.readouterr().err
    assert list(lake.iterdir()) == []  # nothing written
