"""The remediation jobs' own Delta tables: what each resend and replay did, row by row."""

from __future__ import annotations

from pipeline.schemas import struct_of

# One row per replay event (see pipeline.remediation.replay_plan); read by the audits to
# mark dead letters as replayed.
DLQ_REPLAY_LOG = struct_of(
    "replay_id:str, msg_id:str, group:str, topic:str, status:str, reason:str,"
    " new_offset:long, ts:long"
)
REPLAY_LOG_TABLE = "dlq_replay_log"

# One row per stub a resend run acted on (see pipeline.remediation.resend_plan).
RESEND_LOG = struct_of(
    "run_id:str, msg_id:str, topic:str, action:str, reason:str, send_count:int,"
    " next_resend_at:long, broker:str, queue_id:int, new_offset:long, ts:long"
)
RESEND_LOG_TABLE = "resend_log"
