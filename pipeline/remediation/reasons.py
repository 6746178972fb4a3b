"""How a failed send is told in the logs: refused (certainly not stored) or unknown outcome
(a timeout or a lost connection: the broker may have stored it, so look before resending)."""

from __future__ import annotations

from broker_runtime.client.model import MQBrokerError

UNKNOWN_OUTCOME = "unknown outcome"
REFUSED = "refused"


def failure_reason(error: BaseException) -> str:
    """`refused: ...` when a broker answered with an error, else `unknown outcome: ...`."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, MQBrokerError):
            return f"{REFUSED}: {error}"
        cause = cause.__cause__
    return f"{UNKNOWN_OUTCOME}: {error}"


def outcome_unknown(reason: str | None) -> bool:
    return (reason or "").startswith(UNKNOWN_OUTCOME)
