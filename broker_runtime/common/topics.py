"""Topic and group names, and the retry / dead-letter / schedule topic naming rules.

One place for RocketMQ's `MixAll.getRetryTopic` / `getDLQTopic` conventions; the pipeline
imports these too so that lineage is resolved by the same rules the broker routes by.
"""

from __future__ import annotations

import re

from broker_runtime.common.constants import NAME_PATTERN

RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
# Transactional messages (TransactionalMessageUtil): half messages wait in the half topic,
# the op topic records each one's end (tag "d", body its half-topic queue offset), and a
# half message checked transactionCheckMax times goes to the check-max topic.
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
TRANS_CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
TRANS_CHECK_GROUP = "CID_RMQ_SYS_TRANS"  # whose offsets say how far the check has come
TRANS_OP_REMOVE_TAG = "d"
# The route a client sends a new topic's first messages by; the broker then creates the topic
# (TopicValidator.AUTO_CREATE_TOPIC_KEY_TOPIC, registered while autoCreateTopicEnable is on).
AUTO_CREATE_TOPIC = "TBW102"
MAX_NAME_LENGTH = 127

# fullmatch, not `^...$`: `$` would also accept a trailing newline.
_NAME = re.compile(NAME_PATTERN)


class InvalidNameError(ValueError):
    """A topic or group name that the broker refuses (names become file system paths)."""


def _check(kind: str, name: object) -> str:
    if not isinstance(name, str):
        raise InvalidNameError(f"{kind} name must be a string, got {type(name).__name__}")
    if not name:
        raise InvalidNameError(f"{kind} name is empty")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidNameError(
            f"{kind} name is {len(name)} characters long, the limit is {MAX_NAME_LENGTH}"
        )
    if _NAME.fullmatch(name) is None:
        bad = sorted({c for c in name if _NAME.fullmatch(c) is None})
        raise InvalidNameError(
            f"{kind} name {name!r} has characters outside [%|a-zA-Z0-9_-]: {''.join(bad)!r}"
        )
    return name


def validate_topic(name: object) -> str:
    """Return `name` if it is a legal topic name, else raise InvalidNameError saying why."""
    return _check("topic", name)


def validate_group(name: object) -> str:
    """Return `name` if it is a legal consumer/producer group name."""
    return _check("group", name)


def retry_topic(group: str) -> str:
    """The retry topic of a consumer group: `%RETRY%{group}`."""
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    """The dead-letter topic of a consumer group: `%DLQ%{group}`."""
    return DLQ_PREFIX + group


def is_retry_topic(topic: str) -> bool:
    return topic.startswith(RETRY_PREFIX)


def is_dlq_topic(topic: str) -> bool:
    return topic.startswith(DLQ_PREFIX)


def group_of(topic: str) -> str | None:
    """The consumer group a retry or DLQ topic belongs to, or None for an ordinary topic."""
    for prefix in (RETRY_PREFIX, DLQ_PREFIX):
        if topic.startswith(prefix):
            return topic[len(prefix) :]
    return None
