"""The JVM a local Spark session runs on, and the class archive it maps.

A session whose driver is its executor (a `local` master, started by this process) runs on
the newest JDK of at least AOT_JDK that JDK_ROOT holds, or on MQAUDIT_SPARK_JAVA_HOME where
that is set ("": Spark's launcher finds `java` as it would); else, and for every other
session, on the environment's JAVA_HOME or `java`. A cluster's executors run on their
workers' JDK, and a driver on another one than theirs is avoided.

The class archive (pipeline.class_archive records it at set-up) is HotSpot's: on JDK 25 and
later an ahead-of-time cache (JEP 483 and 515: the classes loaded and linked, and the
methods' profiles, so the JIT compiles the hot ones sooner), on older JDKs a dynamic
class-data-sharing archive (the classes loaded). A session maps it only where it starts in
the launch environment it was recorded in (CLASS_ARCHIVE_LAUNCH_ENV, the JDK included).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SPARK_JDK_ENV = "MQAUDIT_SPARK_JAVA_HOME"
JDK_ROOT = Path("/usr/lib/jvm")
AOT_JDK = 25  # the first JDK whose AOT cache keeps the methods' profiles (JEP 515)

CLASS_ARCHIVE_ENV = "MQAUDIT_CLASS_ARCHIVE"  # "off": sessions start without the archive
CLASS_ARCHIVE_RECORD_ENV = "MQAUDIT_CLASS_ARCHIVE_RECORD"  # a recording session's file
# What Spark's launcher builds the driver's class path from, besides the jars themselves
# (whose changes the JVM detects), and the JDK: an archive is mapped only where these are
# as recorded.
CLASS_ARCHIVE_LAUNCH_ENV = (
    "JAVA_HOME",
    "SPARK_HOME",
    "SPARK_CONF_DIR",
    "HADOOP_CONF_DIR",
    "YARN_CONF_DIR",
    "SPARK_DIST_CLASSPATH",
)


def jdk_version(java_home: str) -> int | None:
    """The feature version (17, 25, ...) of the JDK at `java_home` ("": the `java` on the
    PATH), from its `release` file; None where that cannot be read."""
    if java_home:
        home = Path(java_home)
    else:
        java = shutil.which("java")
        if java is None:
            return None
        home = Path(os.path.realpath(java)).parents[1]
    try:
        release = (home / "release").read_text()
    except OSError:
        return None
    found = re.search(r'^JAVA_VERSION="(\d+)', release, re.MULTILINE)
    return int(found.group(1)) if found else None


def local_java_home(root: Path = JDK_ROOT) -> str:
    """The JAVA_HOME a local session is launched with (see the module doc)."""
    chosen = os.environ.get(SPARK_JDK_ENV)
    if chosen is not None:
        return chosen or os.environ.get("JAVA_HOME", "")
    found = []
    for home in root.glob("*"):
        version = jdk_version(str(home))
        if version is not None and version >= AOT_JDK and (home / "bin" / "java").is_file():
            found.append((version, str(home)))
    return max(found)[1] if found else os.environ.get("JAVA_HOME", "")


def local_driver(master: str) -> bool:
    """Whether a session with `master` that this process builds starts its own JVM whose
    driver is its executor (not under spark-submit, whose JVM hands this process a gateway)."""
    return master.startswith("local") and "PYSPARK_GATEWAY_PORT" not in os.environ


def session_java_home(master: str) -> str:
    """The JAVA_HOME of a session with `master` that this process launches."""
    if local_driver(master):
        return local_java_home()
    return os.environ.get("JAVA_HOME", "")


# A local session's driver (its own executor) listens on the loopback interface, where its
# ports serve no other host. Left to look the machine's address up, Spark binds them to the
# first other interface's address and, where the hostname resolves to 127.0.0.1, warns so on
# stderr ("Your hostname, vm, resolves to a loopback address ..."): a line that Airflow logs
# as an error in every task that starts a session. SPARK_LOCAL_IP set by the environment wins.
LOCAL_DRIVER_IP = "127.0.0.1"


@contextmanager
def launched_with(java_home: str, master: str) -> Iterator[None]:
    """The environment Spark's launcher reads while a session's JVM with `master` starts:
    JAVA_HOME (unset where `java_home` is empty) and, for a local driver, SPARK_LOCAL_IP."""
    values = {"JAVA_HOME": java_home or None}
    if local_driver(master):
        values["SPARK_LOCAL_IP"] = os.environ.get("SPARK_LOCAL_IP") or LOCAL_DRIVER_IP
    saved = {name: os.environ.get(name) for name in values}
    try:
        _set_env(values)
        yield
    finally:
        _set_env(saved)


def _set_env(values: dict[str, str | None]) -> None:
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def set_up_dir() -> Path:
    """Where set-up puts what it makes for this environment's JVMs (the class archive, the
    local file system's jar): next to its installed packages."""
    return Path(sys.prefix) / "share" / "mqaudit"


def class_archive_path() -> Path:
    """The archive of this environment's JVM classes."""
    return set_up_dir() / "spark-classes.jsa"


def class_archive_env_file(archive: Path) -> Path:
    """Where the launch environment an archive was recorded in is kept (JSON)."""
    return archive.with_suffix(".json")


def launch_env(java_home: str, class_path: str = "") -> dict[str, str]:
    """The launch environment of a session on `java_home` whose driver's class path starts
    with `class_path` (its spark.driver.extraClassPath): CLASS_ARCHIVE_LAUNCH_ENV."""
    env = {name: os.environ.get(name, "") for name in CLASS_ARCHIVE_LAUNCH_ENV}
    return {**env, "JAVA_HOME": java_home, "DRIVER_CLASS_PATH": class_path}


def class_archive_options(
    java_home: str, archive: Path | None = None, *, class_path: str = ""
) -> str:
    """The JVM options of a new session's driver on `java_home` (with `class_path` before
    Spark's jars) for the archive: record into it (set-up), map it (where it was recorded
    for this launch environment), or nothing. Another class path would make the JVM refuse
    the archive with error lines at every start: the session starts without it instead."""
    aot = (jdk_version(java_home) or 0) >= AOT_JDK
    recording = os.environ.get(CLASS_ARCHIVE_RECORD_ENV)
    if recording:
        # Not its warnings of each class it cannot keep (generated, signed or old-format ones).
        if aot:
            return f"-XX:AOTCacheOutput={recording} -Xlog:aot=off"
        return f"-XX:ArchiveClassesAtExit={recording} -Xlog:cds=off,cds+dynamic=off"
    if os.environ.get(CLASS_ARCHIVE_ENV) == "off":
        return ""
    archive = archive or class_archive_path()
    try:
        recorded = json.loads(class_archive_env_file(archive).read_text())
    except (OSError, ValueError):
        return ""
    if recorded != launch_env(java_home, class_path) or not archive.is_file():
        return ""
    return f"-XX:AOTCache={archive}" if aot else f"-XX:SharedArchiveFile={archive}"
