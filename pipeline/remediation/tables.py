"""The remediation jobs' Delta tables: what each resend and replay did, row by row."""

from __future__ import annotations

from pipeline.audit_schemas import DLQ_REPLAY_LOG
from pipeline.jobs.audit import REPLAY_LOG as REPLAY_LOG_TABLE
from pipeline.schemas import struct_of

# `dlq_replay_log` (schema owned by the audits, which read it to mark dead letters replayed):
# one row per replay event, see pipeline.remediation.replay_plan.
__all__ = ["DLQ_REPLAY_LOG", "REPLAY_LOG_TABLE", "RESEND_LOG", "RESEND_LOG_TABLE"]

# One row per stub a resend run acted on (see pipeline.remediation.resend_plan).
RESEND_LOG = struct_of(
    "run_id:str, msg_id:str, topic:str, action:str, reason:str, send_count:int,"
    " next_resend_at:long, broker:str, queue_id:int, new_offset:long, ts:long"
)
RESEND_LOG_TABLE = "resend_log"
