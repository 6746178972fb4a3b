"""ACL accounts and permissions, as RocketMQ's plain_acl.yml describes them (here as JSON).

{"accounts": [{"accessKey": "ak", "secretKey": "sk", "admin": false,
               "defaultTopicPerm": "DENY", "defaultGroupPerm": "SUB",
               "topicPerms": ["orders=PUB|SUB", "audit=SUB"], "groupPerms": ["g1=SUB"]}]}

Permissions are RocketMQ's bits: DENY 1, ANY 2, PUB 4, SUB 8; "PUB|SUB" (or "PUB+SUB") is both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker_runtime.offsets.json_file import read_with_backup

DENY, ANY, PUB, SUB = 1, 2, 4, 8
_NAMES = {"DENY": DENY, "ANY": ANY, "PUB": PUB, "SUB": SUB}


class AclConfigError(ValueError):
    """An accounts file that cannot be used; the message says which entry and why."""


def parse_perm(text: str) -> int:
    """`PUB|SUB`, `PUB+SUB`, `SUB`, `DENY`... -> permission bits."""
    bits = 0
    for part in text.replace("+", "|").split("|"):
        name = part.strip().upper()
        if name not in _NAMES:
            raise AclConfigError(f"unknown permission {part.strip()!r} in {text!r}")
        bits |= _NAMES[name]
    return bits


def check_perm(needed: int, owned: int) -> bool:
    """Permission.checkPermission: DENY wins; ANY needs PUB or SUB; else a shared bit."""
    if owned & DENY:
        return False
    if needed & ANY:
        return bool(owned & (PUB | SUB))
    return bool(needed & owned)


@dataclass(frozen=True)
class Account:
    access_key: str
    secret_key: str
    admin: bool = False
    default_topic_perm: int = DENY
    default_group_perm: int = DENY
    topic_perms: dict[str, int] = field(default_factory=dict)
    group_perms: dict[str, int] = field(default_factory=dict)

    def allows(self, kind: str, name: str, needed: int) -> bool:
        """Whether this account may use topic or group `name` with `needed` permission."""
        if self.admin:
            return True
        table, default = (
            (self.topic_perms, self.default_topic_perm)
            if kind == "topic"
            else (self.group_perms, self.default_group_perm)
        )
        return check_perm(needed, table.get(name, default))


def _perm_table(entries: Any, where: str) -> dict[str, int]:
    if not isinstance(entries, list):
        raise AclConfigError(f"{where} must be a list of 'name=PERM' strings")
    table: dict[str, int] = {}
    for entry in entries:
        name, sep, perm = str(entry).partition("=")
        if not sep or not name.strip():
            raise AclConfigError(f"{where} entry {entry!r} is not 'name=PERM'")
        table[name.strip()] = parse_perm(perm)
    return table


def parse_accounts(data: Any) -> dict[str, Account]:
    """Accounts by access key, from the JSON shape in this module's docstring."""
    if not isinstance(data, dict) or not isinstance(data.get("accounts"), list):
        raise AclConfigError('an ACL file is a JSON object with an "accounts" list')
    accounts: dict[str, Account] = {}
    for i, raw in enumerate(data["accounts"]):
        where = f"accounts[{i}]"
        if not isinstance(raw, dict):
            raise AclConfigError(f"{where} is not an object")
        ak, sk = raw.get("accessKey"), raw.get("secretKey")
        if not isinstance(ak, str) or not isinstance(sk, str) or len(ak) < 6 or len(sk) < 6:
            # RocketMQ refuses keys shorter than 6 characters as well.
            raise AclConfigError(f"{where}: accessKey and secretKey must be strings of 6+ chars")
        if ak in accounts:
            raise AclConfigError(f"{where}: accessKey {ak!r} appears twice")
        accounts[ak] = Account(
            access_key=ak,
            secret_key=sk,
            admin=bool(raw.get("admin", False)),
            default_topic_perm=parse_perm(str(raw.get("defaultTopicPerm", "DENY"))),
            default_group_perm=parse_perm(str(raw.get("defaultGroupPerm", "DENY"))),
            topic_perms=_perm_table(raw.get("topicPerms", []), f"{where}.topicPerms"),
            group_perms=_perm_table(raw.get("groupPerms", []), f"{where}.groupPerms"),
        )
    return accounts


def load_accounts(path: Path) -> dict[str, Account]:
    data = read_with_backup(Path(path))
    if data is None:
        raise AclConfigError(f"ACL file {path} does not exist")
    return parse_accounts(data)


def admin_account(accounts: dict[str, Account]) -> Account | None:
    """The first admin account: what a broker signs its own calls to other brokers with."""
    return next((a for a in accounts.values() if a.admin), None)
