"""The JVM a local session runs on and the class archive it maps (pipeline/jvm.py,
pipeline/class_archive.py): which JDK, when a session maps the archive, and that the one
set-up made is mapped by a real session's JVM, on the JDK chosen; where its driver listens."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.jvm import (
    AOT_JDK,
    CLASS_ARCHIVE_ENV,
    CLASS_ARCHIVE_LAUNCH_ENV,
    CLASS_ARCHIVE_RECORD_ENV,
    LOCAL_DRIVER_IP,
    SPARK_JDK_ENV,
    class_archive_env_file,
    class_archive_options,
    class_archive_path,
    jdk_version,
    local_java_home,
    session_java_home,
)
from pipeline.local_fs import CLASS_PATH_KEY, with_local_fs
from tests.conftest import REPO, local_spark


@pytest.fixture
def archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An archive recorded for this test's launch environment (its content is not read)."""
    for name in (CLASS_ARCHIVE_RECORD_ENV, CLASS_ARCHIVE_ENV, *CLASS_ARCHIVE_LAUNCH_ENV):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "spark-classes.jsa"
    path.write_bytes(b"jsa")
    recorded = {name: "" for name in CLASS_ARCHIVE_LAUNCH_ENV}
    recorded |= {"JAVA_HOME": str(JDK17), "DRIVER_CLASS_PATH": "/venv/localfs.jar"}
    class_archive_env_file(path).write_text(json.dumps(recorded))
    return path


def _jdk(home: Path, version: str) -> Path:
    """A JDK's home as far as the choice reads it: `release` and `bin/java`."""
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "java").write_text("")
    (home / "release").write_text(f'IMPLEMENTOR="x"\nJAVA_VERSION="{version}"\n')
    return home


JDK17 = Path("/nonexistent/jdk-17")


@pytest.fixture
def jdks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A JDK root with 17, 21, 25.0.3 and 26-ea homes, and a folder that is no JDK."""
    monkeypatch.delenv(SPARK_JDK_ENV, raising=False)
    monkeypatch.setenv("JAVA_HOME", "/env/jdk")
    root = tmp_path / "jvm"
    for name, version in (("a-17", "17.0.15"), ("b-21", "21.0.2"), ("c-25", "25.0.3")):
        _jdk(root / name, version)
    (root / "d-26").mkdir()  # no release file, no java: not a JDK
    return root


def test_local_sessions_run_on_the_newest_jdk_with_an_aot_cache(
    jdks: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert jdk_version(str(jdks / "c-25")) == 25 and jdk_version(str(jdks / "d-26")) is None
    assert local_java_home(jdks) == str(jdks / "c-25")
    _jdk(jdks / "e-27", "27-ea")
    assert local_java_home(jdks) == str(jdks / "e-27")
    monkeypatch.setenv(SPARK_JDK_ENV, str(jdks / "a-17"))  # the setting wins
    assert local_java_home(jdks) == str(jdks / "a-17")
    monkeypatch.setenv(SPARK_JDK_ENV, "")  # the environment's
    assert local_java_home(jdks) == "/env/jdk"


def test_without_a_new_enough_jdk_or_off_local_the_environments_jdk(
    jdks: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.rmtree(jdks / "c-25")
    assert local_java_home(jdks) == "/env/jdk"
    # A cluster's executors run on their workers' JDK: its driver stays on the environment's.
    assert session_java_home("spark://127.0.0.1:7077") == "/env/jdk"
    monkeypatch.setenv(SPARK_JDK_ENV, str(jdks / "b-21"))
    assert session_java_home("local[2]") == str(jdks / "b-21")
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "1")  # under spark-submit: its JVM is running
    assert session_java_home("local[2]") == "/env/jdk"


def test_a_session_maps_the_archive_recorded_for_its_launch_environment(
    archive: Path, tmp_path: Path
) -> None:
    jar = "/venv/localfs.jar"  # the recording session's driver class path
    assert class_archive_options(str(JDK17), archive, class_path=jar) == (
        f"-XX:SharedArchiveFile={archive}"
    )
    # On a JDK with an AOT cache, recorded on it:
    jdk25 = _jdk(tmp_path / "jdk-25", "25.0.3")
    recorded = json.loads(class_archive_env_file(archive).read_text())
    class_archive_env_file(archive).write_text(json.dumps({**recorded, "JAVA_HOME": str(jdk25)}))
    assert class_archive_options(str(jdk25), archive, class_path=jar) == f"-XX:AOTCache={archive}"
    assert class_archive_options(str(JDK17), archive, class_path=jar) == ""  # another JDK


def test_another_class_path_a_missing_archive_or_the_switch_leave_it_out(
    archive: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    jdk, jar = str(JDK17), "/venv/localfs.jar"
    assert class_archive_options(jdk, archive, class_path=jar) != ""
    for other in ("", f"{jar}:/opt/theirs.jar"):  # the driver's class path is not the recorded
        assert class_archive_options(jdk, archive, class_path=other) == ""
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))  # the first entry of the class path
    assert class_archive_options(jdk, archive, class_path=jar) == ""
    monkeypatch.delenv("SPARK_CONF_DIR")
    monkeypatch.setenv(CLASS_ARCHIVE_ENV, "off")
    assert class_archive_options(jdk, archive, class_path=jar) == ""
    monkeypatch.delenv(CLASS_ARCHIVE_ENV)
    archive.unlink()
    assert class_archive_options(jdk, archive, class_path=jar) == ""
    assert class_archive_options(jdk, tmp_path / "never-made.jsa", class_path=jar) == ""


def test_the_recording_session_records_instead_of_mapping(
    archive: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(CLASS_ARCHIVE_RECORD_ENV, str(tmp_path / "new.jsa"))
    assert class_archive_options(str(JDK17), archive).startswith(
        f"-XX:ArchiveClassesAtExit={tmp_path / 'new.jsa'} "
    )
    jdk25 = _jdk(tmp_path / "jdk-25", "25.0.3")
    assert class_archive_options(str(jdk25), archive).startswith(
        f"-XX:AOTCacheOutput={tmp_path / 'new.jsa'} "
    )


_SESSION = """
import sys
from pathlib import Path
from pipeline.spark_session import build_spark
spark = build_spark("class-archive-test", "local[1]", {
    "spark.driver.extraJavaOptions": "-Xlog:class+load=info:file=" + sys.argv[1],
})
spark.range(3).count()
Path(sys.argv[2]).write_text(spark._jvm.java.lang.System.getProperty("java.home"))
spark.stop()
"""


@pytest.mark.slow
def test_a_new_session_loads_spark_and_delta_from_the_set_up_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CLASS_ARCHIVE_ENV, raising=False)
    monkeypatch.delenv(CLASS_ARCHIVE_RECORD_ENV, raising=False)
    jdk = local_java_home()
    class_path = with_local_fs({}).get(CLASS_PATH_KEY, "")  # a local session's
    if class_archive_options(jdk, class_path=class_path) == "":
        why = f"no class archive for this launch environment at {class_archive_path()}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why}: `make` builds it after the Delta jars")
        pytest.skip(f"{why} (make builds it)")
    log, home = tmp_path / "classes.log", tmp_path / "java.home"
    subprocess.run([sys.executable, "-c", _SESSION, str(log), str(home)], cwd=REPO, check=True)
    if jdk:  # the session ran on the JDK chosen for local sessions
        assert Path(home.read_text()).resolve() == Path(jdk).resolve()
    sources = {}
    for line in log.read_text().splitlines():
        name, _, source = line.partition(" source: ")
        sources[name.rsplit(" ", 1)[-1]] = source
    # An AOT cache holds the JDK's classes too; a dynamic archive sits above the JDK's own.
    aot = (jdk_version(jdk) or 0) >= AOT_JDK
    shared = "shared objects file" if aot else "shared objects file (top)"
    assert sources["org.apache.spark.sql.classic.SparkSession"] == shared
    assert sources["io.delta.sql.DeltaSparkSessionExtension"] == shared
    # Against the classes still read from class files (jar:, file:, jrt:); the others come
    # from the JDK's own archive or are made at run time (lambdas, generated code, proxies).
    from_archive = sum(source == shared for source in sources.values())
    loaded = sum(source.startswith(("jar:", "file:", "jrt:")) for source in sources.values())
    assert from_archive > 5 * loaded, (from_archive, loaded)


def _listening_addresses(port: int) -> set[str]:
    """The IPv4 addresses (IPv4-mapped ones of IPv6 sockets included) that TCP sockets of
    this machine listen on at `port` (/proc/net/tcp and tcp6: state 0A is LISTEN)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:
                ipv4 = bytes.fromhex(address[-8:])[::-1]  # little-endian, the last 32 bits
                found.add(".".join(str(b) for b in ipv4))
    return found


def test_a_local_sessions_driver_listens_on_the_loopback_interface_only() -> None:
    spark = local_spark()
    port = int(spark.conf.get("spark.driver.port"))
    assert _listening_addresses(port) == {LOCAL_DRIVER_IP}
