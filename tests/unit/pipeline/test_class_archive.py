"""The JVM class archive (pipeline/class_archive.py): when a session maps it, and that the
one set-up made is mapped by a real session's JVM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.spark_session import (
    CLASS_ARCHIVE_ENV,
    CLASS_ARCHIVE_LAUNCH_ENV,
    CLASS_ARCHIVE_RECORD_ENV,
    class_archive_env_file,
    class_archive_options,
    class_archive_path,
)
from tests.conftest import REPO


@pytest.fixture
def archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An archive recorded for this test's launch environment (its content is not read)."""
    for name in (CLASS_ARCHIVE_RECORD_ENV, CLASS_ARCHIVE_ENV, *CLASS_ARCHIVE_LAUNCH_ENV):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "spark-classes.jsa"
    path.write_bytes(b"jsa")
    class_archive_env_file(path).write_text(
        json.dumps({name: "" for name in CLASS_ARCHIVE_LAUNCH_ENV})
    )
    return path


def test_a_session_maps_the_archive_recorded_for_its_launch_environment(archive: Path) -> None:
    assert class_archive_options(archive) == f"-XX:SharedArchiveFile={archive}"


def test_another_class_path_a_missing_archive_or_the_switch_leave_it_out(
    archive: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))  # the first entry of the class path
    assert class_archive_options(archive) == ""
    monkeypatch.delenv("SPARK_CONF_DIR")
    monkeypatch.setenv(CLASS_ARCHIVE_ENV, "off")
    assert class_archive_options(archive) == ""
    monkeypatch.delenv(CLASS_ARCHIVE_ENV)
    archive.unlink()
    assert class_archive_options(archive) == ""
    assert class_archive_options(tmp_path / "never-made.jsa") == ""


def test_the_recording_session_records_instead_of_mapping(
    archive: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(CLASS_ARCHIVE_RECORD_ENV, str(tmp_path / "new.jsa"))
    assert class_archive_options(archive).startswith(
        f"-XX:ArchiveClassesAtExit={tmp_path / 'new.jsa'} "
    )


_SESSION = """
import sys
from pipeline.spark_session import build_spark
spark = build_spark("class-archive-test", "local[1]", {
    "spark.driver.extraJavaOptions": "-Xlog:class+load=info:file=" + sys.argv[1],
})
spark.range(3).count()
spark.stop()
"""


@pytest.mark.slow
def test_a_new_session_loads_spark_and_delta_from_the_set_up_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CLASS_ARCHIVE_ENV, raising=False)
    monkeypatch.delenv(CLASS_ARCHIVE_RECORD_ENV, raising=False)
    if class_archive_options() == "":
        why = f"no class archive for this launch environment at {class_archive_path()}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why}: `make` builds it after the Delta jars")
        pytest.skip(f"{why} (make builds it)")
    log = tmp_path / "classes.log"
    subprocess.run([sys.executable, "-c", _SESSION, str(log)], cwd=REPO, check=True)
    sources = {}
    for line in log.read_text().splitlines():
        name, _, source = line.partition(" source: ")
        sources[name.rsplit(" ", 1)[-1]] = source
    shared = "shared objects file (top)"  # the dynamic archive, above the JDK's own
    assert sources["org.apache.spark.sql.classic.SparkSession"] == shared
    assert sources["io.delta.sql.DeltaSparkSessionExtension"] == shared
    # Against the classes still read from class files (jar:, file:, jrt:); the others come
    # from the JDK's own archive or are made at run time (lambdas, generated code, proxies).
    from_archive = sum(source == shared for source in sources.values())
    loaded = sum(source.startswith(("jar:", "file:", "jrt:")) for source in sources.values())
    assert from_archive > 5 * loaded, (from_archive, loaded)
