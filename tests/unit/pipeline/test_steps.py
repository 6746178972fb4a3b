"""The audit's steps are declared once: a submitted step's command line gives its command the
same inputs the in-process task gets, for every input the step reads."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from pipeline.cli import add_parser
from pipeline.cli.audit_cmds import inputs_of
from pipeline.steps import (
    AUDIT_STEPS,
    OPTIONS,
    STEPS,
    VALIDATE,
    RunInputs,
    Step,
    gate_params,
    option_value,
    split_dirs,
)

INPUTS = RunInputs(
    lake=Path("/lake"),
    data_dirs=(Path("/data"), Path("/other cluster")),
    out=Path("/out"),
    docs=Path("/docs"),
    run_name="mq_audit-20240101T000000Z",
    as_of_ms=1_700_000_000_000,
    max_send_count=20,
    half_stuck_ms=5_000,  # not the default: the audit's command line must carry it
    ledger_url="postgresql://ledgers",
    rabbit_api="http://u:p@rabbit:15672/api",
    rabbit_vhosts="/,orders",
)


def _parsed(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["pipeline", *argv])


def _values(inputs: RunInputs) -> dict[str, str]:
    return {name: option_value(inputs, name) for name in OPTIONS}


@pytest.mark.parametrize("step", list(STEPS.values()), ids=list(STEPS))
def test_a_submitted_step_reads_what_the_in_process_step_reads(step: Step) -> None:
    args = _parsed(step.argv(_values(INPUTS)))
    assert args.func.__name__ == f"cmd_{step.command.replace('-', '_')}"
    got = inputs_of(args)
    for name in step.reads:
        assert getattr(got, name) == getattr(INPUTS, name), name


def test_the_dag_steps_in_order_and_the_gate_takes_the_runs_bound() -> None:
    assert [s.name for s in AUDIT_STEPS] == ["ingest", "validate", "audit", "report"]
    assert [s.name for s in AUDIT_STEPS if s.gate] == ["validate"]
    assert "max_send_count" in VALIDATE.reads
    assert gate_params(20) == {"message_stub": {"max_send_count": 20}}


def test_an_empty_template_value_is_no_ledger_url() -> None:
    argv = STEPS["ingest"].argv(_values(INPUTS) | {"ledger_url": ""})
    assert inputs_of(_parsed(argv)).ledger_url is None


def test_data_dirs_repeat_or_join_like_path_and_empty_parts_are_dropped() -> None:
    args = _parsed(["ingest", "--lake", "/l", "--data-dir", "/a:/b:", "--data-dir", "/c"])
    assert inputs_of(args).data_dirs == (Path("/a"), Path("/b"), Path("/c"))
    assert split_dirs(["/home:"]) == (Path("/home"),)  # the DAG's template, no other cluster


def test_a_bound_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_send_count must be >= 1"):
        RunInputs(lake=Path("/lake"), max_send_count=0)
    with pytest.raises(ValueError, match="half_stuck_ms must be >= 0"):
        RunInputs(lake=Path("/lake"), half_stuck_ms=-1)
