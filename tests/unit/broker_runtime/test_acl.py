"""ACL: RocketMQ's signature over sorted field values + body, accounts, and the validator."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from broker_runtime.acl.accounts import (
    ANY,
    DENY,
    PUB,
    SUB,
    AclConfigError,
    check_perm,
    parse_accounts,
    parse_perm,
)
from broker_runtime.acl.signing import combine_request_content, sign, verify
from broker_runtime.acl.validator import AclValidator, resources
from broker_runtime.remoting.bodies import ConsumerData, HeartbeatData, SubscriptionData
from broker_runtime.remoting.command import request
from broker_runtime.remoting.protocol import RequestCode, ResponseCode


def test_content_is_values_sorted_by_key_then_body() -> None:
    fields = {"topic": "T", "AccessKey": "ak", "queueId": "3", "Signature": "ignored"}
    # keys sorted: AccessKey, queueId, topic (Java TreeMap: byte order, upper case first)
    assert combine_request_content(fields, b"BODY") == b"ak3TBODY"


def test_sign_matches_hmac_sha1_base64_and_verifies() -> None:
    signed = sign({"topic": "T", "queueId": 3, "flag": None}, b"body", "ak", "secret")
    assert "flag" not in signed and signed["queueId"] == "3"
    expected = base64.b64encode(hmac.new(b"secret", b"ak3Tbody", hashlib.sha1).digest()).decode()
    assert signed["Signature"] == expected
    assert verify(signed, b"body", "secret")
    assert not verify(signed, b"other", "secret")
    assert not verify(signed, b"body", "wrong")
    assert not verify({**signed, "topic": "U"}, b"body", "secret")


def test_permissions() -> None:
    assert parse_perm("PUB|SUB") == parse_perm("PUB+SUB") == PUB | SUB
    assert check_perm(PUB, PUB | SUB) and check_perm(SUB, SUB) and not check_perm(PUB, SUB)
    assert not check_perm(SUB, DENY | SUB)
    assert check_perm(ANY, SUB) and not check_perm(ANY, DENY)
    with pytest.raises(AclConfigError, match="unknown permission"):
        parse_perm("PUB|ALL")


def test_accounts_are_checked() -> None:
    accounts = parse_accounts(
        {
            "accounts": [
                {
                    "accessKey": "producer",
                    "secretKey": "secret1",
                    "defaultTopicPerm": "SUB",
                    "topicPerms": ["orders=PUB", "audit=DENY"],
                }
            ]
        }
    )
    a = accounts["producer"]
    assert a.allows("topic", "orders", PUB) and not a.allows("topic", "orders", SUB)
    assert a.allows("topic", "other", SUB) and not a.allows("topic", "audit", SUB)
    assert not a.allows("group", "g", SUB)  # default group perm: DENY
    for bad, why in (
        ({}, "accounts"),
        ({"accounts": [{"accessKey": "ab", "secretKey": "secret1"}]}, "6\\+ chars"),
        ({"accounts": [{"accessKey": "abcdef", "secretKey": "secret1", "topicPerms": ["x"]}]},
         "name=PERM"),
    ):  # fmt: skip
        with pytest.raises(AclConfigError, match=why):
            parse_accounts(bad)


def test_validator_resources_and_refusals() -> None:
    accounts = parse_accounts(
        {
            "accounts": [
                {"accessKey": "admin1", "secretKey": "secret1", "admin": True},
                {
                    "accessKey": "user01",
                    "secretKey": "secret2",
                    "topicPerms": ["T=PUB|SUB"],
                    "groupPerms": ["g=SUB"],
                },
            ]
        }
    )
    v = AclValidator(accounts)
    hb = HeartbeatData(
        "c",
        consumers=[ConsumerData("g", subscriptions=[SubscriptionData("T"), SubscriptionData("X")])],
    )
    hb_cmd = request(RequestCode.HEART_BEAT, body=hb.encode())
    assert resources(hb_cmd) == [("group", "g", SUB), ("topic", "T", SUB), ("topic", "X", SUB)]
    retry = request(RequestCode.SEND_MESSAGE, {"topic": "%RETRY%g"})
    assert resources(retry) == [("group", "g", SUB)]

    def signed(code: int, fields: dict[str, object], ak: str, sk: str, body: bytes = b""):  # type: ignore[no-untyped-def]
        cmd = request(code, sign(fields, body, ak, sk), body)
        return v.refusal(cmd)

    assert signed(RequestCode.SEND_MESSAGE, {"topic": "T"}, "user01", "secret2") is None
    assert "PUB permission on topic 'X'" in (
        signed(RequestCode.SEND_MESSAGE, {"topic": "X"}, "user01", "secret2") or ""
    )
    assert "admin" in (
        signed(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "T"}, "user01", "secret2") or ""
    )
    assert signed(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "T"}, "admin1", "secret1") is None
    assert "not signed" in (v.refusal(request(RequestCode.SEND_MESSAGE, {"topic": "T"})) or "")
    # As a hook: a refusal is a NO_PERMISSION response to that request.
    resp = v(request(RequestCode.SEND_MESSAGE, {"topic": "T"}), conn=_Peer())  # type: ignore[arg-type]
    assert resp is not None and resp.code == ResponseCode.NO_PERMISSION


class _Peer:
    peer = "test"
