"""One way to get a Spark session for the pipeline: UTC, this interpreter for the workers,
quiet logs, the SQL settings the transforms rely on, and Delta Lake.

Delta Lake comes the standard way: delta-spark's `configure_spark_with_delta_pip` names the
Maven coordinates matching the installed delta-spark and pyspark (`spark.jars.packages`),
which Spark resolves through its Ivy cache. Set-up (`make delta-jars`, run by `make venv`)
fills that cache once, so later sessions start offline. The first session that resolves them
writes the jars Ivy chose to a list beside the cache (RESOLVED); a later session of this
process's kind names those files (`spark.jars`) instead of resolving again, which saves
about 1.5 s of every JVM start (a spark-submit still resolves: its jars may be another
machine's). Where the jars are not there (a
machine that cannot reach Maven Central), sessions start without them and
pipeline.delta_io falls back to its embedded delta-rs backend; one log line says so.
MQAUDIT_DELTA_BACKEND=embedded|native forces a backend (native: the jars are fetched if
missing, and a failure to get them is an error, not a fallback). A session that starts its
JVM runs on the JDK pipeline.jvm picks and maps the class archive set-up made
(pipeline.class_archive), where there is one.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyspark
from pyspark.sql import SparkSession

from pipeline.jvm import class_archive_options, launched_with, local_driver, session_java_home
from pipeline.local_fs import CLASS_PATH_KEY, with_local_fs

log = logging.getLogger(__name__)

DEFAULT_MASTER = "local[2]"
BACKEND_ENV = "MQAUDIT_DELTA_BACKEND"
BACKENDS = ("native", "embedded")
DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
# Spark's default Ivy home since 4.0 (SparkSubmit's --packages); `spark.jars.ivy` moves it.
DEFAULT_IVY_HOME = Path("~/.ivy2.5.2")
# The driver's heap when neither the caller's settings nor Spark's own SPARK_DRIVER_MEMORY name
# one. Spark's 1g is the whole job's memory in local mode (the driver is the executor): two
# audits at once in one session (the tests' truth audit) ran out of it building a broadcast
# join. Only a session that starts the JVM can set it; under spark-submit the submit's wins.
DEFAULT_DRIVER_MEMORY = "2g"

# Settings the pipeline's transforms rely on, applied to any session it is handed.
SQL_CONF = {
    "spark.sql.session.timeZone": "UTC",
    # str_to_map on properties: a repeated key keeps the last value instead of failing.
    "spark.sql.mapKeyDedupPolicy": "LAST_WIN",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # Partitioned writes keep a writer per partition open instead of sorting each task's
    # rows by partition first (a sort of every 1 KiB body).
    "spark.sql.maxConcurrentOutputFileWriters": "64",
}
# Settings for inputs of thousands of rows (the demo, the tests): few shuffle partitions and
# no code generation save more than they cost (Spark's defaults are for big inputs). Without
# whole-stage code, each task still generated (and regex-formatted) the code of every
# projection it made: a third of the demo audit's JVM samples; interpreted projections took
# a warm audit of the demo's lake from 24 s to 18 s. Large lakes keep Spark's defaults.
SMALL_DATA_SPARK = {
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}
# Delta's settings for the lake:
# - a table's state is read with a few tasks, not 50 (the tables' logs are small; 50 tasks
#   cost seconds per read on two cores);
# - the checksum file (`.crc`) of a commit does not list the table's files: listing them ran
#   a Spark job (`allFiles.collect()`) in every commit that creates a table;
# - the commit and checksum files are written through Hadoop's FileSystem API, not its
#   FileContext, whose local rename starts a `readlink` process for each path (16 per
#   commit, counting the side files FILE_IO_CONF drops). On a local disk both check that
#   the file is absent and then rename, so no guarantee changes (see benchmarks/README).
DELTA_SQL_CONF = {
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.databricks.delta.allFilesInCrc.enabled": "false",
    "spark.delta.logStore.file.impl": "io.delta.storage.LocalLogStore",
    "spark.sql.streaming.checkpointFileManagerClass": (
        "org.apache.spark.sql.execution.streaming.checkpointing."
        "FileSystemBasedCheckpointFileManager"
    ),
}
# Local files without Hadoop's checksum side files (`.name.crc`): each one is a second file
# to create, chmod (a process start without Hadoop's native library) and rename. A local
# session's driver also sets permissions without a process (pipeline.local_fs).
FILE_IO_CONF = {"spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem"}


def forced_backend() -> str | None:
    """The backend MQAUDIT_DELTA_BACKEND forces (None: chosen by what loads)."""
    forced = os.environ.get(BACKEND_ENV) or None
    if forced is not None and forced not in BACKENDS:
        raise ValueError(f"{BACKEND_ENV} must be embedded or native, got {forced!r}")
    return forced


def delta_packages() -> str:
    """The Maven coordinates of Delta Lake for the installed delta-spark and pyspark, as
    delta-spark's own configure_spark_with_delta_pip names them."""
    from delta.pip_utils import configure_spark_with_delta_pip

    builder = configure_spark_with_delta_pip(SparkSession.Builder())
    return str(builder._options["spark.jars.packages"])


def _jar_names(packages: str) -> list[str]:
    """`artifact-version.jar` of each `group:artifact:version` coordinate."""
    names = []
    for coord in packages.split(","):
        _, artifact, version = coord.split(":")
        names.append(f"{artifact}-{version}.jar")
    return names


def _ivy_cache_has(packages: str, ivy_home: Path) -> bool:
    cache = ivy_home.expanduser() / "cache"
    for coord, name in zip(packages.split(","), _jar_names(packages), strict=True):
        group, artifact, _ = coord.split(":")
        if not (cache / group / artifact / "jars" / name).is_file():
            return False
    return True


def _resolved_list(packages: str, ivy_home: Path) -> Path:
    name = "-".join(c.split(":")[1] + "-" + c.split(":")[2] for c in packages.split(","))
    return ivy_home.expanduser() / f"mqaudit-resolved-{name}.txt"


def resolved_jars(packages: str, ivy_home: Path) -> str | None:
    """The `spark.jars` value a session with `packages` got last time, if every jar of it is
    still there; None otherwise (the session resolves the packages again)."""
    listed = _resolved_list(packages, ivy_home)
    try:
        head, *jars = listed.read_text().split()
    except (OSError, ValueError):
        return None
    if head != packages or not jars:
        return None
    if not all(Path(j.removeprefix("file://")).is_file() for j in jars):
        return None
    return ",".join(jars)


def _remember_resolved(spark: SparkSession, packages: str, ivy_home: Path) -> None:
    jars = spark.sparkContext.getConf().get("spark.jars") or ""
    if not jars:
        return
    listed = _resolved_list(packages, ivy_home)
    tmp = listed.with_name(f"{listed.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text("\n".join([packages, *jars.split(",")]) + "\n")
        tmp.replace(listed)  # atomic: a concurrent session reads the old list or this one
    except OSError as e:  # a read-only cache: the next session resolves again
        log.debug("could not write %s: %s", listed, e)


def _provided(packages: str) -> bool:
    """Whether Spark's own jars directory already holds Delta (the images bake it in)."""
    dirs = [Path(pyspark.__file__).parent / "jars"]
    if os.environ.get("SPARK_HOME"):
        dirs.append(Path(os.environ["SPARK_HOME"]) / "jars")
    return any((d / _jar_names(packages)[0]).is_file() for d in dirs)


def delta_conf(conf: dict[str, str] | None = None) -> dict[str, str]:
    """The settings that give a new session (or a spark-submit) Delta Lake: the packages
    when the Ivy cache has them (or the backend is forced native), nothing of the packages
    when Spark's jars directory has Delta already, and {} when the jars are missing (logged
    once per call, unless the embedded backend is forced). Where the jars are there, a
    session has them even with the embedded backend forced: a JVM loads its jars once, at
    its start, and the next session of the process may want the native backend."""
    forced = forced_backend()
    packages = delta_packages()
    out = {
        "spark.sql.extensions": DELTA_EXTENSION,
        "spark.sql.catalog.spark_catalog": DELTA_CATALOG,
    }
    out.update(DELTA_SQL_CONF)
    if _provided(packages):
        return out
    ivy_home = Path((conf or {}).get("spark.jars.ivy") or DEFAULT_IVY_HOME)
    if forced == "native" or _ivy_cache_has(packages, ivy_home):
        return {"spark.jars.packages": packages, **out}
    if forced == "embedded":  # as asked: nothing to say
        return {}
    log.warning(
        "Delta Lake jars (%s) are not in the Ivy cache %s ('make delta-jars' fetches them): "
        "using the embedded delta-rs backend",
        packages,
        ivy_home,
    )
    return {}


def launch_conf(conf: dict[str, str] | None = None) -> dict[str, str]:
    """What a new JVM of the pipeline (a session's, or a spark-submit's) starts with: local
    files without side files (FILE_IO_CONF) and Delta Lake where its jars are (delta_conf)."""
    return {**FILE_IO_CONF, **delta_conf(conf)}


def build_spark(
    app: str = "mqaudit", master: str | None = None, conf: dict[str, str] | None = None
) -> SparkSession:
    """Get or create the session; `master` defaults to $SPARK_MASTER or local[2]."""
    # Workers must run this interpreter (the one with the package and pyarrow installed).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app)
    master = master or os.environ.get("SPARK_MASTER", DEFAULT_MASTER)
    # Under spark-submit (its JVM hands this process a gateway) the submit's --master wins:
    # the command line's default local[2] must not turn a cluster job into a local one.
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        builder = builder.master(master)
    builder = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "8")
        # Adaptive execution joins two shuffled inputs by a hash of one side's partition,
        # without sorting either, where every partition of that side is at most this size
        # (larger ones keep the sort-merge join, which spills): on the 4M-row lake the
        # ConsumeQueue's join with the messages took 8.3 s instead of 9.7 s.
        .config("spark.sql.adaptive.maxShuffledHashJoinLocalMapThreshold", "64MB")
        # Generated code is compiled once per distinct plan fragment and kept in a cache of
        # 100 classes by default: an audit makes 600-750, so each audit of a session compiled
        # (and the JIT re-optimised) about 680 of them again. With room for them the second
        # audit of the 1M-row lake compiled 73 and took 26.1 s instead of 31.7 s (static:
        # it holds from the session's start).
        .config("spark.sql.codegen.cache.maxEntries", "2000")
        # PySpark sends each DataFrame API call's Python call site to the JVM (for error
        # messages): about ten py4j round trips per call, half of the time the audit spends
        # building its plans. Static: it holds from the session's start.
        .config("spark.python.sql.dataFrameDebugging.enabled", "false")
    )
    settings = {**SQL_CONF, **launch_conf(conf), **(conf or {})}
    if local_driver(master):
        settings = with_local_fs(settings)
    # The caller's JVM options, else quiet logs; both map the class archive where there is one.
    java_home = session_java_home(master)
    java = settings.get("spark.driver.extraJavaOptions", "-Dlog4j2.level=WARN")
    archive = class_archive_options(java_home, class_path=settings.get(CLASS_PATH_KEY, ""))
    settings["spark.driver.extraJavaOptions"] = f"{java} {archive}".strip()
    if "SPARK_DRIVER_MEMORY" not in os.environ:
        settings.setdefault("spark.driver.memory", DEFAULT_DRIVER_MEMORY)
    packages = settings.get("spark.jars.packages")
    ivy_home = Path(settings.get("spark.jars.ivy") or DEFAULT_IVY_HOME)
    jars = resolved_jars(packages, ivy_home) if packages and "spark.jars" not in settings else None
    if jars is not None:
        del settings["spark.jars.packages"]
        settings["spark.jars"] = jars
    for key, value in settings.items():
        builder = builder.config(key, value)
    with _child_stdout_to_stderr(), launched_with(java_home, master):
        spark = builder.getOrCreate()
    if packages and jars is None and "spark.jars" not in settings:
        _remember_resolved(spark, packages, ivy_home)
    spark.sparkContext.setLogLevel("WARN")
    apply_sql_conf(spark)
    return spark


@contextmanager
def _child_stdout_to_stderr() -> Iterator[None]:
    """The JVM (and the Python workers it starts) inherit stderr as their stdout, so that
    log lines never mix with what a command prints on stdout (JSON)."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def apply_sql_conf(spark: SparkSession) -> None:
    """Make a session handed in from outside (Airflow, a notebook) behave as ours."""
    for key, value in SQL_CONF.items():
        spark.conf.set(key, value)


def native_delta_available(spark: SparkSession) -> bool:
    """Whether delta-spark's classes load in this session's JVM and its extension is on."""
    try:
        loader = spark._jvm.java.lang.Thread.currentThread().getContextClassLoader()  # type: ignore[union-attr]
        spark._jvm.java.lang.Class.forName("io.delta.tables.DeltaTable", False, loader)  # type: ignore[union-attr]
    except Exception:  # py4j raises its own error types for a missing class
        return False
    return DELTA_EXTENSION in (spark.conf.get("spark.sql.extensions", "") or "")


def fetch_delta_jars() -> int:
    """Set-up: resolve Delta Lake's packages into the Ivy cache (a session started with
    them) and check the classes load; 0 when they do."""
    os.environ[BACKEND_ENV] = "native"
    try:
        spark = build_spark("mqaudit-fetch-delta-jars", "local[1]")
    except Exception as e:  # the JVM did not start: no network and no cache
        print(f"delta-jars: could not get {delta_packages()}: {e}", file=sys.stderr)
        return 1
    try:
        ok = native_delta_available(spark)
    finally:
        spark.stop()
    print(f"delta-jars: {delta_packages()} {'in the Ivy cache' if ok else 'did not load'}")
    return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1:] != ["fetch-delta-jars"]:
        sys.exit("usage: python -m pipeline.spark_session fetch-delta-jars")
    sys.exit(fetch_delta_jars())
