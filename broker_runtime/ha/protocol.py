"""The HA wire format, as RocketMQ 4.x's HAConnection/HAClient speak it. No I/O.

slave -> master: its max CommitLog offset, 8 bytes (i64, big-endian), on connect, after
each transfer it appended, and as a heartbeat.
master -> slave: [phyOffset i64, bodySize i32] then bodySize bytes of CommitLog starting at
phyOffset; bodySize 0 is a heartbeat.

Beyond RocketMQ (whose HA port serves the raw log to anyone): when the brokers share a
replication secret, the master opens with a challenge (CHALLENGE_MAGIC + a random nonce)
and the slave answers HMAC-SHA256(secret, nonce) before its first report; a wrong answer
closes the connection before any byte of the log is sent.
"""

from __future__ import annotations

import hashlib
import hmac
import struct

REPORT = struct.Struct(">q")
TRANSFER_HEADER = struct.Struct(">qi")
MAX_TRANSFER = 64 << 20  # a body larger than this is not from a sane master


CHALLENGE_MAGIC = b"mqaudit-ha-auth1"
NONCE_SIZE = 32
CHALLENGE = struct.Struct(f">{len(CHALLENGE_MAGIC)}s{NONCE_SIZE}s")
PROOF_SIZE = hashlib.sha256().digest_size


class HAProtocolError(ValueError):
    pass


def encode_challenge(nonce: bytes) -> bytes:
    return CHALLENGE.pack(CHALLENGE_MAGIC, nonce)


def decode_challenge(raw: bytes) -> bytes:
    magic, nonce = CHALLENGE.unpack(raw)
    if magic != CHALLENGE_MAGIC:
        raise HAProtocolError("the master sent no authentication challenge")
    return bytes(nonce)


def proof(secret: bytes, nonce: bytes) -> bytes:
    """The slave's answer to a challenge."""
    return hmac.new(secret, nonce, hashlib.sha256).digest()


def proof_ok(secret: bytes, nonce: bytes, answer: bytes) -> bool:
    return hmac.compare_digest(proof(secret, nonce), answer)


def encode_report(max_offset: int) -> bytes:
    return REPORT.pack(max_offset)


def decode_report(raw: bytes) -> int:
    (offset,) = REPORT.unpack(raw)
    if offset < 0:
        raise HAProtocolError(f"slave reported a negative offset {offset}")
    return int(offset)


def encode_transfer(phys_offset: int, body: bytes) -> bytes:
    return TRANSFER_HEADER.pack(phys_offset, len(body)) + body


def decode_transfer_header(raw: bytes) -> tuple[int, int]:
    offset, size = TRANSFER_HEADER.unpack(raw)
    if offset < 0 or not 0 <= size <= MAX_TRANSFER:
        raise HAProtocolError(f"bad transfer header: offset {offset}, size {size}")
    return int(offset), int(size)
