"""Where a message a consumer failed goes: `%RETRY%{group}` after a delay, or `%DLQ%{group}`.

Pure, after RocketMQ 4.x SendMessageProcessor.consumerSendMsgBack: the broker reads the
failed message back by its commitlog offset and stores a copy with reconsumeTimes + 1.
Requested delay level 0 means "the broker chooses": 3 + reconsumeTimes (10 s for the first
retry, 2 h from the 16th on); a negative level sends the message to the DLQ at once. Once
reconsumeTimes reaches maxReconsumeTimes (16 by default) the copy goes to the DLQ, which no
consumer reads. The copy keeps every property (UNIQ_KEY, KEYS, TAGS ...) and records lineage
in RETRY_TOPIC (the topic it was first consumed from) and ORIGIN_MESSAGE_ID (the offset id
of the first stored copy).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from broker_runtime.common.constants import FIRST_RETRY_LEVEL, MAX_RECONSUME_TIMES
from broker_runtime.common.delay import DEFAULT_DELAY_LEVELS, DelayLevels
from broker_runtime.common.message import (
    DELAY,
    ORIGIN_MESSAGE_ID,
    RETRY_TOPIC,
    Message,
    StoredMessage,
)
from broker_runtime.common.topics import dlq_topic, retry_topic, validate_group

BROKER_CHOOSES_DELAY = 0  # ConsumeConcurrentlyContext.delayLevelWhenNextConsume
STRAIGHT_TO_DLQ = -1
RETRY_QUEUE_NUMS = 1  # SubscriptionGroupConfig.retryQueueNums
DLQ_QUEUE_NUMS = 1  # DLQ_NUMS_PER_GROUP
_MAX_LEVEL = DelayLevels.parse(DEFAULT_DELAY_LEVELS).max_level


class SendBackTarget(StrEnum):
    RETRY = "RETRY"
    DLQ = "DLQ"


@dataclass(frozen=True)
class SendBackDecision:
    target: SendBackTarget
    topic: str  # %RETRY%{group} or %DLQ%{group}
    queue_id: int
    delay_level: int  # 0 for the DLQ (delivered to no one, so never scheduled)
    reconsume_times: int  # of the new copy: the failed message's + 1


def decide_send_back(
    group: str,
    reconsume_times: int,
    max_reconsume_times: int = MAX_RECONSUME_TIMES,
    delay_level: int = BROKER_CHOOSES_DELAY,
    max_delay_level: int = _MAX_LEVEL,
) -> SendBackDecision:
    """Route one failed message; `reconsume_times` is the count the failed delivery carried.

    A level above `max_delay_level` is capped to it, as the store caps it on put.
    """
    validate_group(group)
    if reconsume_times < 0:
        raise ValueError(f"reconsume_times must be >= 0, got {reconsume_times}")
    if max_reconsume_times < 0:
        raise ValueError(f"max_reconsume_times must be >= 0, got {max_reconsume_times}")
    if reconsume_times >= max_reconsume_times or delay_level < 0:
        return SendBackDecision(SendBackTarget.DLQ, dlq_topic(group), 0, 0, reconsume_times + 1)
    if delay_level == BROKER_CHOOSES_DELAY:
        delay_level = FIRST_RETRY_LEVEL + reconsume_times
    return SendBackDecision(
        SendBackTarget.RETRY,
        retry_topic(group),
        0,
        min(delay_level, max_delay_level),
        reconsume_times + 1,
    )


def send_back_message(failed: StoredMessage, decision: SendBackDecision) -> Message:
    """The copy the broker stores for `failed` (as read back from its commitlog).

    For a retry the copy carries DELAY; the broker's put path turns it into a
    SCHEDULE_TOPIC_XXXX message with REAL_TOPIC/REAL_QID (`delay.to_schedule`), as
    CommitLog.putMessage does for every delayed message.
    """
    props = dict(failed.properties)
    # A retried message already names its first topic; `failed.topic` is then %RETRY%.
    props.setdefault(RETRY_TOPIC, failed.topic)
    if not props.get(ORIGIN_MESSAGE_ID):
        props[ORIGIN_MESSAGE_ID] = failed.msg_id
    if decision.target is SendBackTarget.RETRY:
        props[DELAY] = str(decision.delay_level)
    else:
        props.pop(DELAY, None)
    return Message(
        topic=decision.topic,
        body=failed.body,
        properties=props,
        queue_id=decision.queue_id,
        flag=failed.flag,
        sys_flag=failed.sys_flag,
        born_timestamp=failed.born_timestamp,
        born_host=failed.born_host,
        reconsume_times=decision.reconsume_times,
    )
