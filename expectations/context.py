"""The one GX Data Context of a run: a data source per engine and, per table, its checkpoints.

Two engines validate a table's rows with the same suite: pandas, for a table small enough
to collect (gates.PANDAS_MAX_ROWS): one Spark job fetches it, and GX computes every metric
in this process in milliseconds; and Spark, for a larger one, where each metric is a Spark
job (GX bundles some). On the demo's data the Spark engine spent most of the validate step's
time on those jobs. The suites are written for both (Column row conditions, regexes both
Java and Python read alike: suites.common.END).

Per table and engine the context holds one dataframe asset with a whole-dataframe batch
definition, one
validation definition per table and suite with its checkpoint (pass/fail per expectation,
cheap on Spark), and, once the table fails, one for the `<suite>.failed` suite that re-runs
the failed expectations with sample rows named by the table's row id columns. Data Docs
are built from the results the gates noted, once per `publish_docs()` (a checkpoint action
would rebuild the site's index after every table).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import great_expectations as gx
from great_expectations.data_context.types.base import ProgressBarsConfig
from great_expectations.data_context.types.resource_identifiers import (
    ExpectationSuiteIdentifier,
)

from expectations.offline_docs import localize
from expectations.suites import spec_for

SOURCES = {"spark": "lakehouse", "pandas": "lakehouse_pandas"}  # engine -> GX data source
ENGINES = tuple(SOURCES)
SITE = "mqaudit"
BATCH = "whole"


@dataclass
class Gate:
    """A table's registered quick checkpoint for one suite."""

    table: str
    suite: gx.ExpectationSuite  # as handed in (identity marks it registered)
    stored: gx.ExpectationSuite  # as the context keeps it, with expectation ids
    row_id: tuple[str, ...]
    engine: str  # "spark" or "pandas": which batch the checkpoints take
    quick: gx.Checkpoint


class GateContext:
    """GX set up once per run; `gate()` registers a table's objects on first use only.

    `project_dir=None` keeps suites and results in memory (Data Docs show this run); a folder
    makes a file context there, whose stored results let Data Docs list earlier runs too.
    `docs_dir=None` writes no Data Docs.
    """

    def __init__(
        self,
        docs_dir: Path | str | None = None,
        project_dir: Path | str | None = None,
        *,
        sample_rows: int = 20,
        detail_format: str = "SUMMARY",
    ) -> None:
        if project_dir is None:
            self.gx: Any = gx.get_context(mode="ephemeral")
        else:
            self.gx = gx.get_context(mode="file", project_root_dir=Path(project_dir))
        self.gx.enable_analytics(False)
        # tqdm bars per metric would fill a task log; the gates report their own progress.
        self.gx.variables.progress_bars = ProgressBarsConfig(
            globally=False, metric_calculations=False
        )
        self.docs_dir = Path(docs_dir).resolve() if docs_dir is not None else None
        self.sample_rows = sample_rows
        self.detail_format = detail_format
        self._configure_docs()
        self._sources = {engine: self._source(engine) for engine in ENGINES}
        self._gates: dict[tuple[str, str, str], Gate] = {}
        self._suites: dict[str, gx.ExpectationSuite] = {}
        self._unpublished: list[Any] = []  # result and suite ids not yet in Data Docs
        self._unpublished_since = 0.0

    @property
    def docs_index(self) -> Path | None:
        """Data Docs' index.html (written by the first checkpoint run)."""
        return None if self.docs_dir is None else self.docs_dir / "index.html"

    def _configure_docs(self) -> None:
        for name in list(self.gx.list_data_docs_sites()):
            self.gx.delete_data_docs_site(name)
        if self.docs_dir is not None:
            self.gx.add_data_docs_site(
                SITE,
                {
                    "class_name": "SiteBuilder",
                    "show_how_to_buttons": False,
                    "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
                    "store_backend": {
                        "class_name": "TupleFilesystemStoreBackend",
                        "base_directory": str(self.docs_dir),
                    },
                },
            )

    def _source(self, engine: str) -> Any:
        try:
            return self.gx.data_sources.get(SOURCES[engine])
        except KeyError:
            if engine == "pandas":
                return self.gx.data_sources.add_pandas(name=SOURCES[engine])
            # persist=True: GX caches the batch, so its many metric jobs scan memory, not files.
            return self.gx.data_sources.add_spark(name=SOURCES[engine], persist=True)

    def _batch_definition(self, table: str, engine: str) -> Any:
        source = self._sources[engine]
        try:
            asset = source.get_asset(table)
        except LookupError:
            asset = source.add_dataframe_asset(name=table)
        try:
            return asset.get_batch_definition(BATCH)
        except KeyError:
            return asset.add_batch_definition_whole_dataframe(BATCH)

    def suite_for(self, table: str) -> gx.ExpectationSuite:
        """The table's own suite, built once per context."""
        if table not in self._suites:
            self._suites[table] = spec_for(table).build()
        return self._suites[table]

    def _register(
        self, table: str, suite: gx.ExpectationSuite, engine: str, result_format: dict[str, Any]
    ) -> tuple[gx.ExpectationSuite, gx.Checkpoint]:
        stored = self.gx.suites.add_or_update(suite)
        name = f"{table}.{stored.name}" + ("" if engine == "spark" else f".{engine}")
        validation = self.gx.validation_definitions.add_or_update(
            gx.ValidationDefinition(
                name=name, data=self._batch_definition(table, engine), suite=stored
            )
        )
        checkpoint = self.gx.checkpoints.add_or_update(
            gx.Checkpoint(
                name=f"gate.{name}",
                validation_definitions=[validation],
                result_format=result_format,
            )
        )
        return stored, checkpoint

    def gate(
        self, table: str, suite: gx.ExpectationSuite, row_id: tuple[str, ...], engine: str
    ) -> Gate:
        """The pass/fail checkpoint validating `table` with `suite` on `engine`'s batches,
        registered on first use."""
        key = (table, suite.name, engine)
        known = self._gates.get(key)
        if known is not None and known.suite is suite and known.row_id == row_id:
            return known
        stored, quick = self._register(table, suite, engine, {"result_format": "BOOLEAN_ONLY"})
        gate = Gate(table, suite, stored, row_id, engine, quick)
        self._gates[key] = gate
        return gate

    def detail(self, gate: Gate, failed: set[str]) -> tuple[gx.ExpectationSuite, gx.Checkpoint]:
        """A checkpoint re-running only the `failed` expectations (by id), with sample rows.

        Samples cost a Spark job per expectation on Spark, so they are fetched for failures
        only.
        """
        expectations = []
        for expectation in gate.stored.expectations:
            if expectation.id in failed:
                again = expectation.configuration.to_domain_obj()
                again.id = None
                expectations.append(again)
        suite = gx.ExpectationSuite(name=f"{gate.stored.name}.failed", expectations=expectations)
        return self._register(
            gate.table,
            suite,
            gate.engine,
            {
                "result_format": self.detail_format,
                "unexpected_index_column_names": list(gate.row_id),
                "partial_unexpected_count": self.sample_rows,
            },
        )

    def note(self, checkpoint_result: Any) -> None:
        """Remember a checkpoint run's results for the next `publish_docs()`."""
        if self.docs_dir is None:
            return
        if not self._unpublished:
            self._unpublished_since = time.time()
        for result_id, result in checkpoint_result.run_results.items():
            self._unpublished += [result_id, ExpectationSuiteIdentifier(name=result.suite_name)]

    def publish_docs(self) -> None:
        """Build the noted results' pages and the site's index, once, and make them read
        offline (`localize`: the pages written since the first noted run)."""
        if self.docs_dir is None or not self._unpublished:
            return
        ids, self._unpublished = self._unpublished, []
        self.gx.build_data_docs(site_names=[SITE], resource_identifiers=ids)
        localize(self.docs_dir, since=self._unpublished_since - 1.0)


@functools.cache
def shared_context(docs_dir: Path | None) -> GateContext:
    """One context per process and docs folder, so that gates share it.

    With Data Docs, a file context in the docs folder (GX makes DOCS/gx) keeps every run's
    results, so that the index lists the validations of every step and run (the steps of a
    DAG run are processes of their own); without, an in-memory one.
    """
    if docs_dir is None:
        return GateContext(None)
    return GateContext(docs_dir, project_dir=docs_dir)
