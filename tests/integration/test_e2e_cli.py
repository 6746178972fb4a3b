"""`mqaudit produce`, `consume` and `admin` as a person runs them, against `cluster up`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import mqaudit_cmd
from tests.integration.cluster_fixtures import running_cluster

pytestmark = pytest.mark.integration


def run(env: dict[str, str], *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(mqaudit_cmd(*args), capture_output=True, text=True, env=env, timeout=120)
    if ok:
        assert out.returncode == 0, out.stderr[-3000:]
    return out


def last_json(out: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_produce_consume_and_admin_commands(tmp_path: Path, cli_env: dict[str, str]) -> None:
    with running_cluster(tmp_path / "c", groups=("broker-a", "broker-b"), slaves=False) as c:
        d = ["--data-dir", str(c.data_dir)]
        out = run(cli_env, "admin", "topic-create", *d, "--topic", "CliTopic", "--queues", "2")
        assert "broker-a, broker-b" in out.stdout

        out = run(cli_env, "produce", *d, "--topic", "CliTopic", "--count", "300", "--keys",
                  "--tags", "T1", "--size", "64")  # fmt: skip
        assert last_json(out) == {"sent": 300, "failed": 0, "statuses": {"SEND_OK": 300}}
        assert "sent 300/300" in out.stderr  # progress went to stderr

        args = ["consume", *d, "--group", "cli-g", "--topic", "CliTopic"]
        out = run(cli_env, *args, "--count", "300", "--timeout", "20")
        assert last_json(out) == {"consumed": 300, "unique": 300}

        rows = last_json(run(cli_env, "admin", "consumer-progress", *d, "--group", "cli-g",
                             "--topic", "CliTopic", "--json"))  # fmt: skip
        assert len(rows) == 4 and sum(r["brokerOffset"] for r in rows) == 300
        assert all(r["diff"] == 0 and r["lastTimestamp"] > 0 for r in rows)
        table = run(cli_env, "admin", "consumer-progress", *d, "--group", "cli-g").stdout
        assert table.splitlines()[0].split() == [
            "#Topic", "#Broker", "Name", "#QID", "#Broker", "Offset", "#Consumer", "Offset",
            "#Diff", "#LastTime",
        ]  # fmt: skip
        assert "Diff Total: 0" in table

        status = last_json(run(cli_env, "admin", "topic-status", *d, "--topic", "CliTopic",
                               "--json"))  # fmt: skip
        assert sum(r["maxOffset"] for r in status) == 300
        assert "CliTopic" in last_json(run(cli_env, "admin", "topic-list", *d, "--json"))

        found = last_json(run(cli_env, "admin", "query-msg", *d, "--topic", "CliTopic",
                              "--key", "key-7", "--json"))  # fmt: skip
        assert len(found) == 1 and found[0]["keys"] == "key-7" and found[0]["tags"] == "T1"
        by_uniq = last_json(run(cli_env, "admin", "query-msg", *d, "--topic", "CliTopic",
                                "--id", found[0]["msgId"], "--json"))  # fmt: skip
        by_offset = last_json(run(cli_env, "admin", "query-msg", *d, "--id",
                                  found[0]["offsetMsgId"], "--json"))  # fmt: skip
        assert by_uniq == by_offset == found
        assert by_uniq[0]["body"].startswith("msg-7:")

        # Back to the start: the group gets everything again.
        run(cli_env, "admin", "reset-offset-by-time", *d, "--group", "cli-g", "--topic",
            "CliTopic", "--timestamp", "0")  # fmt: skip
        out = run(cli_env, *args, "--count", "300", "--timeout", "20")
        assert last_json(out) == {"consumed": 300, "unique": 300}

        # Bad input: a clear message and exit code 2, nothing sent.
        bad = run(cli_env, "produce", *d, "--topic", "bad topic", "--count", "1", ok=False)
        assert bad.returncode == 2 and "topic" in bad.stderr
        bad = run(cli_env, "admin", "topic-status", *d, "--topic", "NoSuchTopic", ok=False)
        assert bad.returncode == 2 and "NoSuchTopic" in bad.stderr
        bad = run(cli_env, "consume", "--data-dir", str(tmp_path / "none"), "--group", "g",
                  "--topic", "T", ok=False)  # fmt: skip
        assert bad.returncode == 2 and "cluster.json" in bad.stderr
