"""Files, Apache RocketMQ 5 -> mqaudit: a store written by RocketMQ 5.5.0's broker (the same
official 4.9 Java workload as test_store_files_real.py, java_workload.py) is read by `store
verify` and `store dump` message by message, and the differences from a 4.9 store are named:

- every unit carries two more properties the 5.x broker adds, MSG_REGION and TRACE_ON;
- `checkpoint` holds masterFlushedOffset @24, confirmPhyOffset @32 (both 0 outside HA /
  controller mode) and logicsPhysicalOffset @40 (4.9 writes only the three timestamps);
  mqaudit's own checkpoint keeps its flushed log offset @24 and its ConsumeQueue-flushed
  offset @32, so it reads 0 for both: its recovery re-dispatches from the log's start and
  cuts nothing (shown with `store recover` on a copy);
- more files beside the store: timerwheel, rocksdbstore/, compaction/, config/timercheck,
  config/timermetrics, config/consumerOrderInfo.json, abort.bak; consumerOffset.json gains
  pullOffsetTable and topics.json `attributes`. mqaudit reads past all of them.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_runtime.offsets.consumer_offsets import ConsumerOffsets
from tests.conftest import mqaudit_cmd
from tests.interop import java_workload as jw
from tests.interop import store_checks as sc
from tests.interop.java_workload import Workload
from tests.interop.rocketmq import (
    broker_settings,
    classpath5,
    real_namesrv,
    start_broker,
)

# JVMs boot in ~10 s on an idle machine, minutes at a load of 40: fixture set-up counts too.
pytestmark = [pytest.mark.integration, pytest.mark.interop, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def workload5(
    interop_classpath: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Workload]:
    tmp = tmp_path_factory.mktemp("rocketmq5-to-mq")
    cp5 = classpath5()
    with real_namesrv(tmp / "namesrv", cp=cp5) as ns:
        settings = broker_settings(tmp / "b5", ns.addr, brokerName="broker-v5")
        broker = start_broker(tmp / "b5", settings, cp=cp5)
        try:
            sent = jw.run(ns.addr)
        finally:
            broker.stop()
        yield Workload({"broker-v5": Path(settings["storePathRootDir"])}, [broker.conf], *sent)


def test_mqaudit_reads_a_store_rocketmq5_wrote(workload5: Workload) -> None:
    dumps = jw.check_stores(workload5)
    for row in dumps["broker-v5"]:
        assert row["magic"] == "0xdaa320a7"  # MESSAGE_VERSION_V1, as 4.9 writes
        assert (row["properties"]["MSG_REGION"], row["properties"]["TRACE_ON"]) == (
            "DefaultRegion",
            "true",
        )
    store = workload5.stores["broker-v5"]
    offsets = ConsumerOffsets(store).table()  # fastjson's unquoted keys, extra tables ignored
    committed = offsets[f"{jw.TOPIC}@{jw.GROUP}"]
    for ack in workload5.plain:
        assert committed[ack["queueId"]] > ack["queueOffset"]


def test_rocketmq5_checkpoint_and_extra_files(workload5: Workload, tmp_path: Path) -> None:
    store = workload5.stores["broker-v5"]
    for extra in ("timerwheel", "rocksdbstore", "compaction", "config/timercheck"):
        assert (store / extra).exists(), extra
    raw = (store / "checkpoint").read_bytes()
    assert len(raw) == 4096
    phys_ts, logics_ts, _, master_flushed, confirm, logics_phys = struct.unpack_from(">6q", raw)
    rows = sc.dump(store)
    end = sc.log_end(rows)
    # logicsMsgTimestamp / logicsPhysicalOffset are 0 after some clean stops, set after others
    assert phys_ts > 0 and logics_ts >= 0 and (master_flushed, confirm) == (0, 0)
    assert 0 <= logics_phys <= end
    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    good = sc.log_bytes(copy, end)
    done = subprocess.run(
        mqaudit_cmd("store", "recover", "--store", str(copy)), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["log_end"] == end and report["truncated_bytes"] == 0, report
    assert (report["redispatched_from"], report["redispatched_messages"]) == (0, len(rows))
    assert sc.log_bytes(copy, end) == good and sc.verify(copy)["consistent"]
