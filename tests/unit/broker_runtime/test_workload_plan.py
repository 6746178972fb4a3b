"""Scenario planning: deterministic by seed, independent per scenario, refusing bad input."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from broker_runtime.workload import plan as P
from tests.conftest import mqaudit_cmd


def test_the_same_seed_plans_the_same_faults() -> None:
    assert P.plan_run(42, 2000, "all") == P.plan_run(42, 2000, "all")


def test_another_seed_moves_the_faults() -> None:
    a = {p.name: p.params for p in P.plan_run(1, 2000, "all")}
    b = {p.name: p.params for p in P.plan_run(2, 2000, "all")}
    changed = [n for n in a if a[n] != b[n]]
    assert len(changed) >= 6, changed  # namesrv_split has no random part


def test_a_scenario_plans_alike_alone_or_with_the_others() -> None:
    alone = P.plan_run(5, 300, P.CONSUMER_FAILURES)[0]
    together = {p.name: p for p in P.plan_run(5, 300 * len(P.SCENARIOS), "all")}[
        P.CONSUMER_FAILURES
    ]
    assert alone == together


def test_messages_are_split_evenly_remainder_first() -> None:
    plans = P.plan_run(0, 2003, "all")
    assert [p.name for p in plans] == list(P.SCENARIOS)
    assert [p.messages for p in plans] == [201] * 3 + [200] * 7
    assert sum(p.messages for p in plans) == 2003


def test_comma_separated_scenarios_run_in_catalogue_order() -> None:
    names = [p.name for p in P.plan_run(0, 100, "producer_resend, consumer_crash_unacked")]
    assert names == [P.CONSUMER_CRASH, P.PRODUCER_RESEND]


@pytest.mark.parametrize("m", [P.MIN_MESSAGES, 200, 5000])
def test_fault_positions_fall_inside_the_scenario(m: int) -> None:
    for name in P.SCENARIOS:
        params = P.plan_scenario(name, m, 9).params
        for key in ("hold_index", "ack_lost_from_index", "slave_stops_at_index"):
            if key in params:
                assert 0 < params[key] < m - 1
        if name == P.CONSUMER_FAILURES:
            permanent = set(params["permanent"])
            transient = {int(k) for k in params["transient"]}
            assert permanent and transient and not permanent & transient
            assert all(0 <= i < m for i in permanent | transient)
            assert set(params["transient"].values()) <= {1, 2}
        if name == P.PRODUCER_RESEND:
            assert params["lost_responses"] and all(0 <= i < m for i in params["lost_responses"])


def test_both_rebalance_scenarios_join_at_the_same_point() -> None:
    off = P.plan_scenario(P.REBALANCE_LOCK_OFF, 222, 3).params
    on = P.plan_scenario(P.REBALANCE_LOCK_ON, 222, 3).params
    assert off == on


def test_bad_requests_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="unknown scenario nope"):
        P.plan_run(0, 1000, "nope")
    with pytest.raises(ValueError, match="at least 24"):
        P.plan_run(0, 100, "all")
    with pytest.raises(ValueError, match="unknown scenario"):
        P.resolve(" , ")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--messages", "1000"], "has no cluster.json: start a cluster first"),
        (["--messages", "100"], "each needs at least 24"),
        (["--messages", "1000", "--scenario", "typo"], "unknown scenario typo"),
        (["--messages", "0"], "--messages must be positive"),
    ],
)
def test_the_cli_refuses_what_it_cannot_run(tmp_path: Path, args: list[str], message: str) -> None:
    argv = ["workload", "--data-dir", str(tmp_path / "none"), "--truth", str(tmp_path / "t.json")]
    out = subprocess.run(mqaudit_cmd(*argv, *args), capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert not (tmp_path / "none").exists() and not (tmp_path / "t.json").exists()


@pytest.mark.parametrize("m", [P.MIN_MESSAGES, 200])
def test_each_transaction_has_one_role_inside_the_scenario(m: int) -> None:
    params = P.plan_scenario(P.TRANSACTIONS, m, 4).params
    assert {role: len(idx) for role, idx in params.items()} == P.TX_ROLES
    chosen = [i for idx in params.values() for i in idx]
    assert len(set(chosen)) == len(chosen) and all(0 <= i < m for i in chosen)
    assert params != P.plan_scenario(P.TRANSACTIONS, m, 5).params  # the seed decides
