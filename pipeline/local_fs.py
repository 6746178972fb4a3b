"""Hadoop's file system for the local files of a local session: RawLocalFileSystem without a
process per permission change (pipeline/java/NioLocalFileSystem.java).

Without Hadoop's native library, which pyspark does not ship, RawLocalFileSystem sets the
permission of every directory and file it creates by starting `chmod`: 100 directories
made through it took a warm JVM 0.59-0.73 CPU s (benchmarks/README). A native ingest of the
1M-message benchmark lake started 52 of them, an audit of the demo's lake about 160. The
subclass sets the same bits with java.nio's `Files.setPosixFilePermissions`, a system call
(a mode with the sticky bit, which java.nio cannot set, still goes to `chmod`).

Set-up (`make`, before the class archive, whose class path then has it) compiles the class
with the JDK's `javac` into `jar_path()`. A session whose driver is its executor (a local
master, started by this process: pipeline.jvm.local_driver) gets the jar on the driver's
class path and the class as Spark's `file:` file system (`with_local_fs`). Every other
session, and a spark-submit, keeps RawLocalFileSystem (spark_session.FILE_IO_CONF): their
executors may run where the jar is not. So does a local session where the jar is missing
(no `javac` at set-up), or whose settings name another `file:` file system.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pyspark

from pipeline.jvm import local_java_home, set_up_dir

SOURCE = Path(__file__).with_name("java") / "NioLocalFileSystem.java"
NIO_FS = "mqaudit.hadoop.NioLocalFileSystem"
RAW_FS = "org.apache.hadoop.fs.RawLocalFileSystem"
FS_KEY = "spark.hadoop.fs.file.impl"
CLASS_PATH_KEY = "spark.driver.extraClassPath"


def jar_path() -> Path:
    """Where set-up puts the jar."""
    return set_up_dir() / "mqaudit-localfs.jar"


def with_local_fs(settings: dict[str, str], jar: Path | None = None) -> dict[str, str]:
    """A local session's settings with NioLocalFileSystem where the jar is there and they
    name RawLocalFileSystem (or no `file:` file system); the caller's driver class path
    keeps its entries, after the jar."""
    jar = jar or jar_path()
    if settings.get(FS_KEY, RAW_FS) != RAW_FS or not jar.is_file():
        return settings
    theirs = settings.get(CLASS_PATH_KEY)
    class_path = os.pathsep.join([str(jar), theirs] if theirs else [str(jar)])
    return {**settings, FS_KEY: NIO_FS, CLASS_PATH_KEY: class_path}


def _javac() -> str | None:
    """The `javac` of the local sessions' JDK, else of JAVA_HOME, else the PATH's."""
    for home in (local_java_home(), os.environ.get("JAVA_HOME", "")):
        if home and (Path(home) / "bin" / "javac").is_file():
            return str(Path(home) / "bin" / "javac")
    return shutil.which("javac")


def build(jar: Path | None = None) -> int:
    """Set-up: compile the class against pyspark's Hadoop jar into `jar`; 0 when it was
    written, 1 (saying why) when it was not."""
    jar = jar or jar_path()
    javac = _javac()
    hadoop = sorted((Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar"))
    if javac is None or not hadoop:
        why = "no javac" if javac is None else "no hadoop-client-api jar in pyspark"
        print(f"local-fs: {why}: local sessions use RawLocalFileSystem", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="mqaudit-localfs-") as tmp:
        argv = [javac, "--release", "17", "-nowarn", "-cp", str(hadoop[-1]), "-d", tmp]
        done = subprocess.run([*argv, str(SOURCE)], check=False)
        if done.returncode != 0:
            print(f"local-fs: javac exited {done.returncode}", file=sys.stderr)
            return 1
        jar.parent.mkdir(parents=True, exist_ok=True)
        partial = jar.with_name(f"{jar.name}.{os.getpid()}.tmp")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\n\r\n")
            for f in sorted(Path(tmp).rglob("*.class")):
                z.write(f, f.relative_to(tmp).as_posix())
        partial.replace(jar)  # a session starting now loads the old jar or this one
    print(f"local-fs: {jar}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] != ["build"]:
        sys.exit("usage: python -m pipeline.local_fs build")
    sys.exit(build())
