"""Frozen configuration of the store (RocketMQ's MessageStoreConfig, the parts we use)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from broker_runtime.common.constants import DEFAULT_CLUSTER, MAX_RECONSUME_TIMES
from broker_runtime.common.delay import DEFAULT_DELAY_LEVELS, DelayLevels


class FlushMode(StrEnum):
    SYNC = "sync"  # SYNC_FLUSH: a put returns after fdatasync (group commit)
    ASYNC = "async"  # ASYNC_FLUSH: a background flush every flush_interval_ms


@dataclass(frozen=True)
class StoreConfig:
    store_dir: Path
    segment_size: int = 1 << 30  # mappedFileSizeCommitLog
    cq_entries_per_file: int = 300_000  # mappedFileSizeConsumeQueue / 20
    index_hash_slots: int = 5_000_000
    index_max_entries: int = 20_000_000
    build_index: bool = True
    flush: FlushMode = FlushMode.ASYNC
    flush_interval_ms: int = 500  # flushIntervalCommitLog
    cq_flush_interval_ms: int = 1000  # flushIntervalConsumeQueue (and the checkpoint)
    max_message_size: int = 4 * 1024 * 1024
    store_host: tuple[str, int] = ("127.0.0.1", 10911)
    # Expired-file cleanup (CleanCommitLogService).
    file_reserved_hours: float = 72.0
    delete_when: str = "04"  # hours of day, ";"-separated
    cleanup_interval_ms: int = 10_000
    disk_max_used_ratio: float = 0.75  # past this, delete expired files at any hour
    disk_force_clean_ratio: float = 0.85  # past this, delete the oldest files even if not expired
    disk_danger_ratio: float = 0.90  # past this, refuse writes
    # Delay levels (messageDelayLevel): the store needs them for the SCHEDULE_TOPIC_XXXX
    # ConsumeQueue, whose tag code is the delivery time. `delay_time_scale` multiplies
    # every level (0.001: seconds become milliseconds, for tests).
    message_delay_level: str = DEFAULT_DELAY_LEVELS
    delay_time_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.segment_size < 4096:
            raise ValueError(f"segment_size {self.segment_size} is below 4096 bytes")
        if self.max_message_size > self.segment_size - 8:  # a unit must fit an empty segment
            object.__setattr__(self, "max_message_size", self.segment_size - 8)
        if not 0 < self.disk_max_used_ratio <= self.disk_force_clean_ratio <= 1:
            raise ValueError("disk ratios must satisfy 0 < max_used <= force_clean <= 1")
        self.delay_levels()  # a bad level string fails here, not in the dispatcher

    def delay_levels(self) -> DelayLevels:
        return DelayLevels.parse(self.message_delay_level, self.delay_time_scale)


class BrokerRole(StrEnum):
    """brokerRole: how a master replicates, or that this broker is a slave."""

    ASYNC_MASTER = "ASYNC_MASTER"  # a send is acknowledged once the master has it
    SYNC_MASTER = "SYNC_MASTER"  # ... once a slave has acknowledged it too
    SLAVE = "SLAVE"

    @property
    def is_master(self) -> bool:
        return self is not BrokerRole.SLAVE


@dataclass(frozen=True)
class NamesrvConfig:
    """A name server (RocketMQ's NamesrvConfig + the housekeeping intervals)."""

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 9876
    scan_interval_ms: int = 10_000  # how often expired brokers are looked for
    broker_expiry_ms: int = 120_000  # BROKER_CHANNEL_EXPIRED_TIME

    def __post_init__(self) -> None:
        if self.scan_interval_ms <= 0 or self.broker_expiry_ms <= 0:
            raise ValueError("name server intervals must be positive")


@dataclass(frozen=True)
class BrokerConfig:
    """A broker (RocketMQ's BrokerConfig, the HA part of MessageStoreConfig), and its store."""

    store: StoreConfig
    cluster_name: str = DEFAULT_CLUSTER
    broker_name: str = "broker-a"
    broker_id: int = 0  # 0 master, 1 slave
    role: BrokerRole = BrokerRole.ASYNC_MASTER
    host: str = "127.0.0.1"
    port: int = 10911  # listenPort
    ha_port: int = 10912  # haListenPort (masters listen, slaves ignore it)
    namesrv_addrs: tuple[str, ...] = ()  # host:port of every name server
    register_interval_ms: int = 30_000  # registerNameServerPeriod
    auto_create_topic: bool = True  # autoCreateTopicEnable
    auto_create_subscription_group: bool = True
    default_queue_nums: int = 4  # defaultTopicQueueNums (read and write)
    long_polling: bool = True  # longPollingEnable
    short_polling_ms: int = 1000  # shortPollingTimeMills, when long polling is off
    max_pull_bytes: int = 1 << 20  # bytes of messages one pull returns at most
    max_suspend_ms: int = 60_000  # a longer suspend timeout asked for is cut to this
    slave_read_enable: bool = True  # RocketMQ's default is false: see README
    suggest_slave_lag_bytes: int = 64 << 20  # a pull this far behind is told to use the slave
    client_expiry_ms: int = 120_000  # channelExpiredTimeout
    client_scan_interval_ms: int = 10_000
    offset_persist_interval_ms: int = 5_000  # flushConsumerOffsetInterval
    # A master's consumer offset snapshots over time (offsets/offset_history.py): one per
    # interval (0: none), the newest `offset_history_keep` kept. Not in RocketMQ.
    offset_history_interval_ms: int = 0
    offset_history_keep: int = 1_440
    ha_master_addr: str | None = None  # a slave's master HA address; else from the name server
    ha_heartbeat_interval_ms: int = 5_000  # haSendHeartbeatInterval
    ha_housekeeping_ms: int = 20_000  # haHousekeepingInterval: a silent peer is dropped
    ha_reconnect_ms: int = 1_000
    ha_transfer_batch: int = 256 * 1024  # haTransferBatchSize
    ha_max_gap_bytes: int = 256 << 20  # haMaxGapNotInSync: a slave further behind is "not OK"
    sync_replica_timeout_ms: int = 5_000  # syncFlushTimeout, as SYNC_MASTER waits use it
    slave_sync_interval_ms: int = 10_000  # SlaveSynchronize: topics, groups, offsets
    acl_enable: bool = False
    acl_file: Path | None = None  # accounts (see broker_runtime.acl.accounts)
    # A file holding the replication secret slaves prove they know (ha/protocol.py); without
    # it, an ACL cluster uses its admin account's secret key, and no ACL means an open port.
    ha_secret_file: Path | None = None
    # Consume retry: the maxReconsumeTimes of auto-created groups, and the fallback for a
    # retry sent without one (a request's own value wins, as RocketMQ's since 3.4.9).
    max_reconsume_times: int = MAX_RECONSUME_TIMES
    delay_offset_persist_interval_ms: int = 10_000  # flushDelayOffsetInterval
    # Orderly consumption: a LOCK_BATCH_MQ lock lives this long unless renewed.
    rebalance_lock_max_live_ms: int = 60_000  # rocketmq.broker.rebalance.lockMaxLiveTime
    # Queue access lock (DeFiBus mqAccessControlEnable): a queue's new owner may
    # pull once the old owner acked what it was delivered, left, or was idle this long.
    queue_access_lock: bool = False
    # Transactions: half messages older than the timeout (or their
    # CHECK_IMMUNITY_TIME_IN_SECONDS) without an end are checked back every interval, at most
    # transaction_check_max times (then moved to TRANS_CHECK_MAX_TIME_TOPIC).
    transaction_timeout_ms: int = 6_000  # transactionTimeOut
    transaction_check_max: int = 15  # transactionCheckMax
    transaction_check_interval_ms: int = 60_000  # transactionCheckInterval
    # SQL92 subscriptions (MessageSelector.bySql) are refused unless this is on, as RocketMQ's.
    enable_property_filter: bool = False  # enablePropertyFilter
    queue_lock_hold_timeout_ms: int = 30_000  # lockQueueTimeout

    def __post_init__(self) -> None:
        if self.role is BrokerRole.SLAVE and self.broker_id == 0:
            raise ValueError("a slave needs a brokerId other than 0")
        if self.role.is_master and self.broker_id != 0:
            raise ValueError(f"a master has brokerId 0, not {self.broker_id}")
        if self.default_queue_nums <= 0:
            raise ValueError("default_queue_nums must be positive")
        if self.acl_enable and self.acl_file is None:
            raise ValueError("acl_enable needs acl_file (the accounts)")
        if self.max_reconsume_times < 0:
            raise ValueError("max_reconsume_times must be >= 0")
        for name in (
            "delay_offset_persist_interval_ms",
            "rebalance_lock_max_live_ms",
            "queue_lock_hold_timeout_ms",
            "offset_history_keep",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.offset_history_interval_ms < 0:
            raise ValueError("offset_history_interval_ms must be >= 0 (0: no history)")

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def ha_addr(self) -> str:
        return f"{self.host}:{self.ha_port}"
