"""resend_candidates and manual_handling: the seed 002 6.5.1 rules one by one."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from pipeline.transforms.resend import by_system, manual_handling, resend_candidates
from tests.unit.pipeline.audit_helpers import T0, assert_rows, delivery, log, stub, stubs

pytestmark = pytest.mark.slow

AS_OF = T0 + 100_000
DUE = {"status": "UNCONFIRMED", "next_resend_at": T0 + 50_000}
UNSENT = {"broker": None, "queue_id": None, "queue_offset": None}  # no acknowledgement ever


def test_resend_rules_and_manual_handling(spark: SparkSession) -> None:
    ledger = stubs(
        spark,
        [
            stub("U1", **DUE | UNSENT),  # never acknowledged, due: resend
            stub("U2", **DUE | UNSENT | {"next_resend_at": T0 + 200_000}),  # not due yet
            stub("U3", **DUE | {"send_count": 3}),  # at the max send count: manual
            stub("U4", **DUE | {"queue_offset": 2}),  # consumers are past offset 2: resend
            stub("U5", **DUE | {"queue_offset": 9}),  # consumers are not at offset 9 yet
            stub("U6", **DUE | UNSENT),  # in the message log: it arrived
            stub("U7"),  # CONFIRMED
            stub("U8", **DUE | {"status": "VOID", "send_count": 5}),  # given up
            stub("U9", **DUE | {"send_count": 4}),  # past the max and in the log: manual
            stub("U10", **DUE | {"created_at": AS_OF + 1}),  # after the run's as-of
        ],
    )
    consumed = log(spark, [delivery(1, "X", queue_offset=5), delivery(2, "U6"), delivery(3, "U9")])
    assert_rows(
        resend_candidates(ledger, consumed, 3, AS_OF),
        ["msg_id", "group", "kind", "cause", "count", "max_log_offset", "as_of_ms"],
        [
            ("U1", None, "resend_due", "never_acknowledged", 1, None, AS_OF),
            ("U4", None, "resend_due", "offset_passed_by_consumers", 1, 5, AS_OF),
        ],
    )
    assert_rows(
        manual_handling(ledger, consumed, 3, AS_OF),
        ["msg_id", "kind", "cause", "count", "send_count", "in_message_log"],
        [
            ("U3", "max_send_count", "send_count_at_max", 3, 3, False),
            ("U9", "max_send_count", "send_count_at_max", 4, 4, True),
        ],
    )


def test_each_system_is_judged_against_its_own_log(spark: SparkSession) -> None:
    rabbit = {"system": "rabbitmq", "topic": "orders", "broker": "vh"}
    ledger = stubs(
        spark,
        [
            stub("R1", **DUE | UNSENT | rabbit),  # never confirmed by RabbitMQ: resend
            stub("R2", **DUE | UNSENT | rabbit),  # a RabbitMQ consumer logged it: arrived
            stub("R3", **DUE | UNSENT | rabbit | {"send_count": 3}),  # at the max: manual
            stub("U1", **DUE | UNSENT),  # RocketMQ's, as before
        ],
    )
    consumed = log(spark, [delivery(1, "R2", system="rabbitmq", group="work")])
    cols = ["msg_id", "kind", "cause", "system"]
    assert_rows(
        by_system(resend_candidates, ledger, consumed, 3, AS_OF),
        cols,
        [
            ("R1", "resend_due", "never_acknowledged", "rabbitmq"),
            ("U1", "resend_due", "never_acknowledged", "rocketmq"),
        ],
    )
    assert_rows(
        by_system(manual_handling, ledger, consumed, 3, AS_OF),
        cols,
        [("R3", "max_send_count", "send_count_at_max", "rabbitmq")],
    )
