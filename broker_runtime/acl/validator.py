"""The broker's ACL check, as a ProcessorTable hook (RocketMQ's PlainAccessValidator).

Every request must carry AccessKey and a Signature over its fields and body; requests that
touch a topic or a group also need the account's permission on it, and admin operations
need an admin account. A refusal is a NO_PERMISSION response saying why.
"""

from __future__ import annotations

import logging

from broker_runtime.acl.accounts import ANY, PUB, SUB, Account
from broker_runtime.acl.signing import ACCESS_KEY, SIGNATURE, verify
from broker_runtime.common.topics import RETRY_PREFIX
from broker_runtime.remoting.bodies import BodyError, HeartbeatData
from broker_runtime.remoting.command import RemotingCommand, response_to
from broker_runtime.remoting.connection import Connection
from broker_runtime.remoting.protocol import RequestCode as C
from broker_runtime.remoting.protocol import ResponseCode

log = logging.getLogger(__name__)

ADMIN_CODES = frozenset(
    {
        C.UPDATE_AND_CREATE_TOPIC,
        C.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
        C.INVOKE_BROKER_TO_RESET_OFFSET,
    }
)

Resource = tuple[str, str, int]  # ("topic" | "group", name, needed permission)


def _topic(name: str | None, needed: int) -> list[Resource]:
    if not name:
        return []
    if name.startswith(RETRY_PREFIX):  # a retry topic belongs to its group
        return [("group", name[len(RETRY_PREFIX) :], SUB)]
    return [("topic", name, needed)]


def _group(name: str | None) -> list[Resource]:
    return [("group", name, SUB)] if name else []


def resources(cmd: RemotingCommand) -> list[Resource]:
    """What a request touches and the permission it needs on each (PlainAccessValidator.parse)."""
    f = cmd.ext_fields
    code = cmd.code
    if code in (C.SEND_MESSAGE, C.SEND_BATCH_MESSAGE, C.SEND_MESSAGE_V2):
        # SEND_MESSAGE_V2 and the Java client's batches name the topic "b"
        return _topic(f.get("b") if "b" in f else f.get("topic"), PUB)
    if code == C.CONSUMER_SEND_MSG_BACK:
        return _group(f.get("group"))
    if code in (C.PULL_MESSAGE, C.UPDATE_CONSUMER_OFFSET, C.QUERY_CONSUMER_OFFSET):
        return _topic(f.get("topic"), SUB) + _group(f.get("consumerGroup"))
    if code == C.QUERY_MESSAGE:
        return _topic(f.get("topic"), SUB)
    if code in (C.GET_CONSUMER_LIST_BY_GROUP, C.UNREGISTER_CLIENT):
        return _group(f.get("consumerGroup"))
    if code == C.HEART_BEAT:
        try:
            hb = HeartbeatData.decode(cmd.body)
        except BodyError:
            return []  # the processor answers a bad body itself
        out: list[Resource] = []
        for c in hb.consumers:
            out += _group(c.group_name)
            for s in c.subscriptions:
                out += _topic(s.topic, SUB)
        return out
    return []


class AclValidator:
    """Callable as a ProcessorTable hook: None lets the request through."""

    def __init__(self, accounts: dict[str, Account]) -> None:
        self.accounts = accounts

    def __call__(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand | None:
        reason = self.refusal(cmd)
        if reason is None:
            return None
        log.warning("ACL refused request %d from %s: %s", cmd.code, conn.peer, reason)
        return response_to(cmd, ResponseCode.NO_PERMISSION, f"ACL: {reason}")

    def refusal(self, cmd: RemotingCommand) -> str | None:
        """Why `cmd` is refused, or None if it may pass."""
        ak = cmd.ext_fields.get(ACCESS_KEY)
        if ak is None or SIGNATURE not in cmd.ext_fields:
            return "request is not signed (AccessKey and Signature are required)"
        account = self.accounts.get(ak)
        if account is None:
            return f"no account with AccessKey {ak!r}"
        if not verify(cmd.ext_fields, cmd.body, account.secret_key):
            return f"signature check failed for AccessKey {ak!r}"
        if cmd.code in ADMIN_CODES and not account.admin:
            return f"request code {cmd.code} needs an admin account, {ak!r} is not one"
        for kind, name, needed in resources(cmd):
            if not account.allows(kind, name, needed):
                what = {PUB: "PUB", SUB: "SUB", ANY: "PUB or SUB"}.get(needed, str(needed))
                return f"{ak!r} has no {what} permission on {kind} {name!r}"
        return None
