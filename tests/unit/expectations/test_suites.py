"""Suites, parameters and failure reports as plain data (no Spark jobs)."""

from __future__ import annotations

import json

import great_expectations.expectations as gxe
import pytest

from expectations.results import Failure, GateResult, plain
from expectations.suites import AUDIT_TABLES, INGESTED_TABLES, SPECS, spec_for
from expectations.suites.common import referenced_columns, resolve_parameters, suite_parameters
from pipeline.lake import AUDIT_TABLES as AUDIT_SCHEMAS
from pipeline.lake import INGESTED_TABLES as TABLES


@pytest.mark.parametrize("table", sorted(SPECS))
def test_every_parameter_has_a_default_and_no_default_is_stray(table: str) -> None:
    spec = SPECS[table]
    suite = spec.build()
    assert suite.name == table
    assert suite_parameters(suite) == set(spec.defaults)
    assert set(spec.doc) <= set(spec.defaults)


@pytest.mark.parametrize("table", sorted(SPECS))
def test_suites_read_only_columns_of_the_pipeline_schemas(table: str) -> None:
    spec = SPECS[table]
    derived = {"prev_queue_offset", "store_before_born_ms", "prev_phys_offset", "is_latest"}
    columns = set((TABLES | AUDIT_SCHEMAS)[table].fieldNames())
    assert referenced_columns(spec.build()) - derived <= columns
    assert set(spec.row_id) <= columns


def test_tables_are_split_into_ingested_and_audit() -> None:
    assert set(INGESTED_TABLES) | set(AUDIT_TABLES) == set(SPECS)
    assert "audit_lag" in AUDIT_TABLES and "messages" not in AUDIT_TABLES


def test_unknown_table_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="messages"):
        spec_for("mesages")


def test_parameters_default_override_and_refuse_misspellings() -> None:
    spec = SPECS["messages"]
    suite = spec.build()
    values = resolve_parameters(suite, spec.defaults, {"clock_skew_ms": 5})
    assert values["clock_skew_ms"] == 5
    assert values["min_crc_ok_ratio"] == spec.defaults["min_crc_ok_ratio"]
    with pytest.raises(ValueError, match=r"no parameter clock_skew;.*clock_skew_ms"):
        resolve_parameters(suite, spec.defaults, {"clock_skew": 5})
    with pytest.raises(ValueError, match="needs a value for max_reconsume_times"):
        given = {"clock_skew_ms": 1, "min_crc_ok_ratio": 1.0, "min_timestamp_ms": 0}
        resolve_parameters(suite, {}, given)


def test_referenced_columns_include_row_conditions() -> None:
    lag = SPECS["audit_lag"].build()
    assert {"is_latest", "lag_ms", "status", "snapshot_ts"} <= referenced_columns(lag)
    assert "final" in referenced_columns(SPECS["quarantine"].build())


def test_failure_text_names_expectation_columns_parameter_and_rows() -> None:
    failure = Failure(
        expectation=gxe.ExpectColumnValuesToBeBetween.__name__,
        columns=["store_before_born_ms"],
        kwargs={"max_value": 1000},
        parameters={"max_value": "clock_skew_ms"},
        unexpected_count=1,
        element_count=9,
        rows=[{"broker": "b", "phys_offset": 42, "store_before_born_ms": 5000}] * 7,
    )
    result = GateResult("messages", "messages", False, 24, [failure], {"clock_skew_ms": 1000}, 0.5)
    text = result.describe(max_rows=2)
    assert "table 'messages' (suite 'messages'): 1 of 24 expectations failed" in text
    assert "[store_before_born_ms] max_value=1000 ($clock_skew_ms): 1 of 9 rows unexpected" in text
    assert text.count('"phys_offset": 42') == 2 and "5 more in the sample" in text
    assert json.loads(json.dumps(result.to_dict()))["failures"][0]["rows"][0]["phys_offset"] == 42


def test_plain_makes_gx_values_json_able() -> None:
    class Condition:
        def __repr__(self) -> str:
            return "final == True"

    value = {"a": (1, 2.5), "b": {Condition()}, "c": None}
    assert json.dumps(plain(value)) == '{"a": [1, 2.5], "b": ["final == True"], "c": null}'
