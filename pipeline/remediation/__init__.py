"""Remediation: resending what was never acknowledged and replaying dead letters, safely.

Planning is pure (`resend_plan`, `replay_plan`, `replay_request`): rows in, decisions out.
Execution (`sender`, `outcome_log`, `bodies`) talks to the broker, the ledger and the lake,
and is driven by the jobs in `pipeline.jobs.resend` and `pipeline.jobs.replay`.
"""
