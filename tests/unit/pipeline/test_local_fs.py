"""Hadoop's file system for a local session's files (pipeline/local_fs.py): which sessions get
NioLocalFileSystem, and that it sets what RawLocalFileSystem's `chmod` set, in a real
session's JVM."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest
from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

from pipeline.local_fs import CLASS_PATH_KEY, FS_KEY, NIO_FS, RAW_FS, jar_path, with_local_fs


def test_a_local_session_gets_the_class_where_the_jar_is(tmp_path: Path) -> None:
    jar = tmp_path / "localfs.jar"
    settings = {FS_KEY: RAW_FS, "spark.x": "1"}
    assert with_local_fs(settings, jar) == settings  # no jar (no javac at set-up): Hadoop's
    jar.write_bytes(b"jar")
    assert with_local_fs(settings, jar) == {
        FS_KEY: NIO_FS, CLASS_PATH_KEY: str(jar), "spark.x": "1"
    }  # fmt: skip
    assert with_local_fs({}, jar) == {FS_KEY: NIO_FS, CLASS_PATH_KEY: str(jar)}
    theirs = {FS_KEY: RAW_FS, CLASS_PATH_KEY: "/opt/a.jar"}  # the caller's class path stays
    assert with_local_fs(theirs, jar)[CLASS_PATH_KEY] == f"{jar}{os.pathsep}/opt/a.jar"
    other = {FS_KEY: "org.example.TheirFileSystem"}  # the caller's own file system wins
    assert with_local_fs(other, jar) == other


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _modes(fs: Any, jvm: Any, root: Path) -> list[int]:
    """The modes of what the same calls through `fs` make and change under `root`."""
    hadoop = jvm.org.apache.hadoop.fs

    def path(p: Path) -> Any:
        return hadoop.Path(f"file://{p}")

    def perm(mode: int) -> Any:
        return hadoop.permission.FsPermission(jvm.java.lang.Short(mode))

    made = root / "a" / "b"
    assert fs.mkdirs(path(made), perm(0o750))
    modes = [_mode(made.parent), _mode(made)]
    out = fs.create(path(made / "f"), perm(0o640), False, 4096, 1, 1 << 20, None)
    out.write(b"x")
    out.close()
    assert (made / "f").read_bytes() == b"x"
    modes.append(_mode(made / "f"))
    for mode in (0o604, 0o000, 0o777, 0o1777):  # the sticky bit goes to chmod
        fs.setPermission(path(made), perm(mode))
        modes.append(_mode(made))
    fs.setPermission(path(made), perm(0o755))
    with pytest.raises(Py4JJavaError, match=r"NoSuchFile|No such file"):
        fs.setPermission(path(root / "missing"), perm(0o644))
    return modes


@pytest.mark.skipif(shutil.which("javac") is None, reason="no javac: set-up builds no jar")
def test_the_sessions_file_system_sets_permissions_as_hadoops_chmod_did(
    spark: SparkSession, tmp_path: Path
) -> None:
    assert jar_path().is_file(), "make builds the jar where there is a javac"
    jvm: Any = spark._jvm
    conf = spark._jsc.hadoopConfiguration()  # type: ignore[union-attr]
    ours = jvm.org.apache.hadoop.fs.Path("file:///").getFileSystem(conf)
    assert ours.getClass().getName() == NIO_FS
    hadoops = jvm.org.apache.hadoop.fs.RawLocalFileSystem()
    hadoops.initialize(jvm.java.net.URI("file:///"), conf)
    os.umask(umask := os.umask(0o022))
    want = _modes(hadoops, jvm, tmp_path / "raw")
    assert want == [0o777 & ~umask, 0o750 & ~umask, 0o640 & ~umask, 0o604, 0, 0o777, 0o1777]
    assert _modes(ours, jvm, tmp_path / "ours") == want
