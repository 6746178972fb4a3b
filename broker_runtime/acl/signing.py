"""Request signatures as RocketMQ's AclUtils computes them.

content = the values of every extField except `Signature`, in key order, concatenated, then
the body bytes; Signature = base64(HMAC-SHA1(secretKey, content)). `AccessKey` is itself an
extField, so it is part of what is signed.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

from broker_runtime.remoting.command import RemotingCommand, wire_fields

ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"
UNIQUE_MSG_QUERY_FLAG = "_UNIQUE_KEY_QUERY"  # MixAll's, added to QUERY_MESSAGE after signing
_UNSIGNED = frozenset({SIGNATURE, UNIQUE_MSG_QUERY_FLAG})


def combine_request_content(fields: dict[str, str], body: bytes) -> bytes:
    """AclUtils.combineRequestContent over already-stringified fields. The Java client signs
    its header's fields, not QUERY_MESSAGE's extra `_UNIQUE_KEY_QUERY`: the broker skips it."""
    text = "".join(v for k, v in sorted(fields.items()) if k not in _UNSIGNED)
    return text.encode() + body


def signature(content: bytes, secret_key: str) -> str:
    """AclUtils.calSignature: base64 of HMAC-SHA1."""
    digest = hmac.new(secret_key.encode(), content, hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


def sign(
    fields: dict[str, object], body: bytes, access_key: str, secret_key: str
) -> dict[str, str]:
    """`fields` as they go on the wire, plus AccessKey and Signature.

    Pass the result as the request's fields (values are stringified as `request()` does).
    """
    out = wire_fields(fields)
    out.pop(SIGNATURE, None)
    out[ACCESS_KEY] = access_key
    out[SIGNATURE] = signature(combine_request_content(out, body), secret_key)
    return out


def sign_command(cmd: RemotingCommand, access_key: str, secret_key: str) -> RemotingCommand:
    """Sign a built request in place (its fields and body are final)."""
    cmd.ext_fields = sign(dict(cmd.ext_fields), cmd.body, access_key, secret_key)
    return cmd


def verify(fields: dict[str, str], body: bytes, secret_key: str) -> bool:
    """Whether `fields[Signature]` signs the other fields and the body with `secret_key`."""
    given = fields.get(SIGNATURE)
    if given is None:
        return False
    expected = signature(combine_request_content(fields, body), secret_key)
    return hmac.compare_digest(given.encode(), expected.encode())
