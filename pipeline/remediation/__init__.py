"""Remediation: resending what was never acknowledged, replaying dead letters and repairing
losses after acknowledgement, safely.

Planning is pure (`resend_plan`, `replay_plan`, `replay_request`): rows in, decisions out.
Execution (`sender`, `rabbit_sender`, `sends`, `outcome_log`, `resend_bodies`) talks to the
brokers (the cluster, or RabbitMQ through `rabbit_sender`), the ledger and the lake, and is
driven by the jobs in `pipeline.jobs.resend`, `pipeline.jobs.replay` and `pipeline.jobs.repair`.
"""
