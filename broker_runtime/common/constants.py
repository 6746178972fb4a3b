"""Numbers the broker, the clients and the audit share, each defined here once.

RocketMQ's names are in the comments; the values are its defaults.
"""

from __future__ import annotations

# SubscriptionGroupConfig.retryMaxTimes / DefaultMQPushConsumer.maxReconsumeTimes: a message
# whose reconsumeTimes reaches it goes to the group's DLQ instead of another retry.
MAX_RECONSUME_TIMES = 16

# The broker's delay level for a retry when the consumer leaves it to the broker (level 0):
# FIRST_RETRY_LEVEL + reconsumeTimes, 10 s for the first retry.
FIRST_RETRY_LEVEL = 3

# Sends of one message by its producer (first send and resends) after which a stub is voided
# and listed for a person: the resend job's bound, the audit's and the ledger gate's.
DEFAULT_MAX_SEND_COUNT = 16

# A ConsumeQueue entry's size field for a blank entry (a hole, or the rest of a file):
# Integer.MAX_VALUE. No stored message is that large.
CQ_BLANK_SIZE = 0x7FFFFFFF

# Topic and group names: RocketMQ's TopicValidator.VALID_CHAR_PATTERN with its length limit.
NAME_PATTERN = r"[%|a-zA-Z0-9_-]{1,127}"

# How old a half message with no op, commit or give-up must be before the audit calls it stuck:
# RocketMQ's transactionTimeOut (6 s) + transactionCheckInterval (60 s) defaults, by when a
# check pass must have taken it up.
HALF_STUCK_AFTER_MS = 66_000

# Subscription expression types (ExpressionType.TAG, ExpressionType.SQL92).
TAG = "TAG"
SQL92 = "SQL92"

# BrokerConfig.brokerClusterName's default: the cluster of a broker (or a data dir) that
# names none.
DEFAULT_CLUSTER = "DefaultCluster"
