"""`mqaudit`'s parser: one of the broker's own commands builds only its own parser (a node's
process imports only what it runs); anything else builds all of them, downstream ones too."""

from __future__ import annotations

import subprocess
import sys

import pytest

from broker_runtime.cli.main import COMMANDS, build_parser, main
from tests.conftest import REPO

HEAVY = ("pipeline", "pandas", "sqlalchemy", "pyspark", "airflow", "great_expectations")


def _choices(parser: object) -> list[str]:
    return list(parser._subparsers._group_actions[0].choices)  # type: ignore[attr-defined]


@pytest.mark.parametrize("command", ["namesrv", "broker", "cluster"])
def test_a_node_or_cluster_command_imports_none_of_the_downstream_libraries(command: str) -> None:
    code = (
        "import sys\n"
        "from broker_runtime.cli.main import build_parser\n"
        f"build_parser({command!r})\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout


def test_own_command_parses_as_with_the_whole_parser() -> None:
    argv = ["broker", "--config", "b.json", "--port", "0", "--set", "a=1", "--set", "b=2"]
    alone, whole = build_parser("broker").parse_args(argv), build_parser().parse_args(argv)
    assert vars(alone) == vars(whole)
    assert alone.port == 0 and alone.set == ["a=1", "b=2"]
    assert _choices(build_parser("broker")) == ["namesrv", "broker"]


def test_whole_parser_has_every_command_downstream_ones_too() -> None:
    choices = _choices(build_parser())
    assert choices[: len(COMMANDS)] == list(COMMANDS)
    assert {"pipeline", "demo", "airflow"} <= set(choices)


def test_unknown_command_is_refused_naming_all(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["nosuch"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'nosuch'" in err and "'pipeline'" in err and "'namesrv'" in err
