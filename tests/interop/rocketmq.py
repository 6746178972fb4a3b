"""Apache RocketMQ itself for the interop tests: its name server and broker as real JVM
processes on 127.0.0.1, and the official client programs of `java/` run one per call.

    cp = classpath()                                   # builds tests/interop with Maven once
    with real_namesrv(tmp / "ns") as ns, real_broker(tmp / "b", ns.addr) as broker:
        rows = java("Producer", "--namesrv", ns.addr, "--topic", "T", "--count", "10")
        out = mqadmin(ns.addr, "topicRoute", "-t", "T")

Processes start with `java -cp` (the distribution's shell scripts carry JVM flags Java 17
refuses) and the `--add-opens` flags RocketMQ 4.9 needs there; their stores live in the
caller's temp dir; they stop by PID (SIGTERM: the broker's shutdown hook flushes and removes
its `abort` file; SIGKILL after a timeout). Without `java` or `mvn` the tests skip, except
under CI=true, where they fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from broker_runtime.client.admin import MQAdmin
from broker_runtime.client.model import MQClientError
from broker_runtime.remoting.protocol import RequestCode
from tests.db_servers import stop_process

INTEROP = Path(__file__).resolve().parent
CONF = INTEROP / "conf"
TARGET = INTEROP / "target"
ROCKETMQ5 = INTEROP / "rocketmq5"
START_TIMEOUT_S = 180.0  # RocketMQ 5.5 took over 90 s to boot at load 40 on 2 cores

# RocketMQ 4.9 reaches into these JDK internals (direct-buffer cleaners, netty, fastjson).
ADD_OPENS = [
    f"--add-opens=java.base/{pkg}=ALL-UNNAMED"
    for pkg in (
        "java.lang",
        "java.lang.reflect",
        "java.nio",
        "java.util",
        "java.util.concurrent",
        "sun.nio.ch",
        "jdk.internal.ref",
        "jdk.internal.misc",
    )
]


def _unavailable(what: str) -> None:
    message = f"{what} (make system-deps installs maven; Java 17 comes with the machine)"
    if os.environ.get("CI") == "true":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def _sources_newer_than(stamp: Path, sources: list[Path]) -> bool:
    if not stamp.exists():
        return True
    built = stamp.stat().st_mtime
    return any(src.stat().st_mtime > built for src in sources)


def _maven_classpath(project: Path, sources: list[Path]) -> str:
    """Build `project/pom.xml` when needed (offline once ~/.m2 holds its dependencies);
    the classpath its dependency plugin wrote."""
    if shutil.which("java") is None or shutil.which("mvn") is None:
        _unavailable("java and mvn are needed for the Apache RocketMQ interop tests")
    stamp = project / "target" / "classpath.txt"
    if _sources_newer_than(stamp, [project / "pom.xml", *sources]):
        build = ["mvn", "-q", "-f", str(project / "pom.xml"), "compile"]
        done = subprocess.run([*build[:1], "-o", *build[1:]], capture_output=True, text=True)
        if done.returncode != 0:  # dependencies not cached yet: fetch them from Maven Central
            done = subprocess.run(build, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"mvn compile failed:\n{done.stdout[-4000:]}{done.stderr[-4000:]}")
        stamp.touch()
    return stamp.read_text().strip()


def classpath() -> str:
    """The official jars plus the compiled programs, building them first when needed (offline
    once ~/.m2 holds the dependencies; `make interop-build` does the first download)."""
    jars = _maven_classpath(INTEROP, list((INTEROP / "java").rglob("*.java")))
    return jars + os.pathsep + str(TARGET / "classes")


def classpath5() -> str:
    """Apache RocketMQ 5's name server and broker (rocketmq5/pom.xml), for `start_broker` and
    `real_namesrv` with `cp=`; the client programs stay on `classpath()`."""
    return _maven_classpath(ROCKETMQ5, [])


def _java_env() -> dict[str, str]:
    return {**os.environ, "ROCKETMQ_HOME": str(INTEROP)}


def java_argv(main: str, *args: str, heap: str = "256m") -> list[str]:
    """argv of one of the programs in java/ (`Producer`, ...) or a fully qualified class, run
    by java/mqinterop/Run.java: the JVM ends when its main returns (not seconds later)."""
    cls = main if "." in main else f"mqinterop.{main}"
    return [
        "java",
        f"-Xmx{heap}",
        *ADD_OPENS,
        f"-Dlogback.configurationFile={CONF / 'logback_client.xml'}",
        "-Drocketmq.client.logUseSlf4j=true",
        "-cp",
        classpath(),
        "mqinterop.Run",
        cls,
        *args,
    ]


def json_lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects a program printed, one per line; other lines are ignored."""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def java(main: str, *args: str, timeout: float = 120.0) -> list[dict[str, Any]]:
    """Run a program to its end; its JSON lines. A non-zero exit raises with its stderr."""
    done = subprocess.run(
        java_argv(main, *args), capture_output=True, text=True, timeout=timeout, env=_java_env()
    )
    if done.returncode != 0:
        raise RuntimeError(f"{main} exited {done.returncode}:\n{done.stderr[-4000:]}")
    return json_lines(done.stdout)


def mqadmin(namesrv: str, command: str, *args: str, timeout: float = 120.0) -> str:
    """The official mqadmin (rocketmq-tools' MQAdminStartup): what it printed on stdout.
    mqadmin reports most errors on stdout and exits 0, so callers check the text."""
    argv = java_argv(
        "org.apache.rocketmq.tools.command.MQAdminStartup", command, "-n", namesrv, *args
    )
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=_java_env())
    if done.returncode != 0:
        raise RuntimeError(f"mqadmin {command} exited {done.returncode}:\n{done.stderr[-4000:]}")
    return done.stdout


def _listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
        return True
    return False


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
        return True


def broker_ports() -> int:
    """A listen port P with P-2 (the broker's "fast" port) and P+1 (HA) free as well."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port > 1026 and _free(port) and _free(port - 2) and _free(port + 1):
            return port
    raise RuntimeError("no free port triple for a RocketMQ broker")


@dataclass
class JavaServer:
    """A started name server or broker: its process, port, log and config file."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    conf: Path
    home: Path
    settings: dict[str, str] = field(default_factory=dict)

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        """SIGTERM (a clean shutdown), SIGKILL after the timeout; by PID."""
        stop_process(self.proc, timeout_s=60)

    def kill(self) -> None:
        """SIGKILL: a crash."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _start(
    main: str, home: Path, conf: dict[str, str], port: int, ready: str, cp: str | None = None
) -> JavaServer:
    home.mkdir(parents=True, exist_ok=True)
    conf_file = home / f"{main.rsplit('.', 1)[-1]}.conf"
    conf_file.write_text("".join(f"{k}={v}\n" for k, v in conf.items()))
    log = home / "java.log"
    logback = CONF / ("logback_namesrv.xml" if "Namesrv" in main else "logback_broker.xml")
    argv = [
        "java",
        "-Xms256m",
        "-Xmx512m",
        *ADD_OPENS,
        f"-Dlogback.configurationFile={logback}",
        f"-Duser.home={home}",
        "-cp",
        cp or classpath(),
        main,
        "-c",
        str(conf_file),
    ]
    with log.open("wb") as out:
        # A session of its own, as `mqaudit cluster up` starts its nodes: with the kernel's
        # autogroup scheduling a session is a scheduling group, and a server in its caller's
        # would share one CPU share with the caller's clients (cluster_bench runs both).
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=_java_env(), start_new_session=True
        )
    server = JavaServer(proc, port, log, conf_file, home, conf)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{main} exited {proc.returncode}:\n{log.read_text()[-4000:]}")
        if ready in log.read_text(errors="replace") and _listening(port):
            return server
        time.sleep(0.1)
    server.kill()
    raise RuntimeError(f"{main} not ready in {START_TIMEOUT_S} s:\n{log.read_text()[-4000:]}")


@contextlib.contextmanager
def real_namesrv(home: Path, cp: str | None = None) -> Iterator[JavaServer]:
    """Apache RocketMQ's name server on 127.0.0.1 and an ephemeral port (`cp`: another
    release's jars, such as `classpath5()`)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = _start(
        "org.apache.rocketmq.namesrv.NamesrvStartup",
        home,
        {"listenPort": str(port)},
        port,
        "The Name Server boot success",
        cp,
    )
    try:
        yield server
    finally:
        server.stop()


def broker_settings(home: Path, namesrv: str, **overrides: str) -> dict[str, str]:
    """A broker config: store under `home/store`, 64 MiB commitlog files, delay levels of 1 s
    (RocketMQ parses only s/m/h/d, so 1 s is its shortest), automatic topics."""
    store = home / "store"
    port = broker_ports()
    settings = {
        "brokerClusterName": "interop",
        "brokerName": "broker-r",
        "brokerId": "0",
        "namesrvAddr": namesrv,
        "brokerIP1": "127.0.0.1",
        "listenPort": str(port),
        "haListenPort": str(port + 1),
        "storePathRootDir": str(store),
        "storePathCommitLog": str(store / "commitlog"),
        "mappedFileSizeCommitLog": str(64 << 20),
        "autoCreateTopicEnable": "true",
        "autoCreateSubscriptionGroup": "true",
        "flushDiskType": "ASYNC_FLUSH",
        "brokerRole": "ASYNC_MASTER",
        "messageDelayLevel": " ".join(["1s"] * 18),
        "registerNameServerPeriod": "5000",
    }
    settings.update(overrides)
    return settings


def start_broker(home: Path, settings: dict[str, str], cp: str | None = None) -> JavaServer:
    """Apache RocketMQ's broker with `settings` (see `broker_settings`); ready once it has
    said "boot success", answers on its port and every name server of `namesrvAddr` lists it.
    Starting again on the same settings reuses its store (recovery after a crash or a clean
    stop). `cp`: another release's jars."""
    server = _start(
        "org.apache.rocketmq.broker.BrokerStartup",
        home,
        settings,
        int(settings["listenPort"]),
        "boot success",
        cp,
    )
    try:
        asyncio.run(_registered(settings, server.addr))
    except BaseException:
        server.kill()
        raise
    return server


async def _registered(settings: dict[str, str], addr: str) -> None:
    """Until each name server lists the broker at `addr`. The broker says "boot success" even
    when its first registration timed out (RocketMQ 5 under load), and then registers again only
    on its period: a client asking for a route in between gets "No route info" on every send."""
    name, broker_id = settings["brokerName"], settings.get("brokerId", "0")
    deadline = time.monotonic() + START_TIMEOUT_S
    for ns in settings["namesrvAddr"].split(";"):
        async with MQAdmin(ns) as admin:
            while True:
                try:  # a name server slow to answer under load is asked again
                    info = await admin.api.namesrv_json(RequestCode.GET_BROKER_CLUSTER_INFO)
                except MQClientError as e:
                    info = {"error": str(e)}
                addrs = info.get("brokerAddrTable", {}).get(name, {}).get("brokerAddrs", {})
                if {str(k): v for k, v in addrs.items()}.get(broker_id) == addr:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} at {addr} not registered with {ns}: {info}")
                await asyncio.sleep(0.1)


@contextlib.contextmanager
def real_broker(home: Path, namesrv: str, **overrides: str) -> Iterator[JavaServer]:
    """`start_broker` for the length of a block; stopped cleanly at its end."""
    server = start_broker(home, broker_settings(home, namesrv, **overrides))
    try:
        yield server
    finally:
        server.stop()
