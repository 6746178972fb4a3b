"""Message counts and rates, and the GET_BROKER_RUNTIME_INFO keys RocketMQ's tools read.

RocketMQ's StoreStatsService and BrokerStats: messages put and messages handed to consumers,
their rates over the last 10 s, 60 s and 600 s (sampled once a second), and the totals at
this morning's and yesterday morning's midnight. mqadmin clusterList and brokerStatus print
these keys (`putTps`, `getTransferedTps`, `msgPutTotalTodayNow`, `brokerVersionDesc`, ...).
"""

from __future__ import annotations

import shutil
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broker_runtime.broker.controller import BrokerController

# The RocketMQ release whose protocol this broker speaks (MQVersion.Version.V4_9_7's ordinal):
# clients gate features on it.
VERSION_DESC = "V4_9_7"
VERSION = 407
WINDOWS_S = (10, 60, 600)
DAY_MS = 86_400_000


class BrokerStats:
    """Counters fed by the send and pull paths; `sample` once a second makes the rates."""

    def __init__(self, boot_ms: int) -> None:
        self.boot_ms = boot_ms
        self.put_total = 0
        self.got_total = 0
        self._samples: deque[tuple[int, int, int]] = deque(maxlen=max(WINDOWS_S) + 1)
        self._day = -1
        self.put_today_morning = self.put_yesterday_morning = 0
        self.got_today_morning = self.got_yesterday_morning = 0

    def on_put(self, n: int) -> None:
        self.put_total += n

    def on_got(self, n: int) -> None:
        self.got_total += n

    def sample(self, now_ms: int) -> None:
        """Record the counters (every second), and the morning totals when a day begins
        (UTC days: RocketMQ's are the broker's local ones)."""
        self._samples.append((now_ms, self.put_total, self.got_total))
        day = now_ms // DAY_MS
        if day != self._day:
            if self._day >= 0:
                self.put_yesterday_morning = self.put_today_morning
                self.got_yesterday_morning = self.got_today_morning
                self.put_today_morning, self.got_today_morning = self.put_total, self.got_total
            self._day = day

    def tps(self, which: int, window_s: int) -> float:
        """Messages per second over the last `window_s` (which: 1 put, 2 got); 0 before two
        samples."""
        if len(self._samples) < 2:
            return 0.0
        last = self._samples[-1]
        first = self._samples[max(0, len(self._samples) - 1 - window_s)]
        elapsed = (last[0] - first[0]) / 1000
        return (last[which] - first[which]) / elapsed if elapsed > 0 else 0.0

    def rates(self, which: int) -> str:
        return " ".join(str(self.tps(which, w)) for w in WINDOWS_S)


def human_bytes(n: int) -> str:
    """MixAll.humanReadableByteCount(n, false): "57.9 GiB"."""
    if n < 1024:
        return f"{n} B"
    exp = min(6, (n.bit_length() - 1) // 10)
    return f"{n / 1024**exp:.1f} {'KMGTPE'[exp - 1]}iB"


def _uptime(ms: int) -> str:
    s = ms // 1000
    d, h, m = s // 86400, s % 86400 // 3600, s % 3600 // 60
    return f"[ {d} days, {h} hours, {m} minutes, {s % 60} seconds ]"


def rocketmq_runtime_info(ctl: BrokerController) -> dict[str, object]:
    """The keys of AdminBrokerProcessor.prepareRuntimeInfo this broker has a meaning for.
    Thread-pool queue sizes and waits are 0: requests run on the event loop, unqueued."""
    store = ctl.require_store()
    stats = ctl.stats
    now = ctl.clock.now_ms()
    log = store.commit_log
    first = store.message_at(log.min_offset) if log.max_offset > log.min_offset else None
    disk = shutil.disk_usage(store.root)
    return {
        "brokerVersionDesc": VERSION_DESC,
        "brokerVersion": VERSION,
        "bootTimestamp": stats.boot_ms,
        "runtime": _uptime(now - stats.boot_ms),
        "putTps": stats.rates(1),
        "getTransferedTps": stats.rates(2),
        "msgPutTotalTodayNow": stats.put_total,
        "msgGetTotalTodayNow": stats.got_total,
        "msgPutTotalTodayMorning": stats.put_today_morning,
        "msgGetTotalTodayMorning": stats.got_today_morning,
        "msgPutTotalYesterdayMorning": stats.put_yesterday_morning,
        "msgGetTotalYesterdayMorning": stats.got_yesterday_morning,
        "sendThreadPoolQueueSize": 0,
        "sendThreadPoolQueueHeadWaitTimeMills": 0,
        "pullThreadPoolQueueSize": 0,
        "pullThreadPoolQueueHeadWaitTimeMills": 0,
        "pageCacheLockTimeMills": 0,
        "dispatchBehindBytes": log.max_offset - store.dispatcher.dispatched_offset,
        "earliestMessageTimeStamp": first.store_timestamp if first is not None else -1,
        "commitLogDiskRatio": round((disk.total - disk.free) / disk.total, 2),
        "commitLogDirCapacity": (
            f"Total : {human_bytes(disk.total)}, Free : {human_bytes(disk.free)}."
        ),
    }
