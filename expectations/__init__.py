"""Great Expectations gates for the lakehouse tables: suites as code, run as checkpoints.

`expectations.suites` holds one suite function per table with its parameter defaults,
`expectations.context` the one GX Data Context of a run, `expectations.gates` the
gates (`run_gate`, `run_all_gates`, `GateFailed`) that DAG tasks and reports call.
"""

import logging
import os
import warnings

# GX reads this when a context is created; a pipeline run must not phone home.
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
# GX logs at INFO while it imports (a line for each function it documents, 200-odd) and then
# at every save of its config and dump of a model: most of a task log, around the gates' own
# lines. Its warnings and errors still show.
logging.getLogger("great_expectations").setLevel(logging.WARNING)

with warnings.catch_warnings():
    # GX 1.24 imports the deprecated `sre_constants`/`sre_parse`; runs with warnings as errors
    # (pytest, Airflow's DagBag) must still be able to import the gates.
    warnings.filterwarnings("ignore", r"module 'sre_\w+' is deprecated", DeprecationWarning)
    import great_expectations  # noqa: F401
