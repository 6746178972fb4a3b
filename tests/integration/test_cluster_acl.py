"""ACL on a real cluster: signed requests, per-topic/group permissions, admin-only operations."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from broker_runtime.acl.signing import sign_command
from broker_runtime.remoting.command import request
from broker_runtime.remoting.headers import CreateTopicRequestHeader, SendMessageRequestHeader
from broker_runtime.remoting.protocol import RequestCode as C
from broker_runtime.remoting.protocol import ResponseCode as R
from tests.integration.cluster_fixtures import RawClient, running_cluster

pytestmark = pytest.mark.integration

ADMIN = ("adminKey01", "adminSecret01")
PRODUCER = ("producerKey", "producerSecret")
CONSUMER = ("consumerKey", "consumerSecret")

ACCOUNTS = {
    "accounts": [
        {"accessKey": ADMIN[0], "secretKey": ADMIN[1], "admin": True},
        {
            "accessKey": PRODUCER[0],
            "secretKey": PRODUCER[1],
            "defaultTopicPerm": "DENY",
            "defaultGroupPerm": "DENY",
            "topicPerms": ["AclTopic=PUB"],
        },
        {
            "accessKey": CONSUMER[0],
            "secretKey": CONSUMER[1],
            "defaultTopicPerm": "DENY",
            "defaultGroupPerm": "DENY",
            "topicPerms": ["AclTopic=SUB"],
            "groupPerms": ["AclGroup=SUB"],
        },
    ]
}


def test_acl_refuses_unsigned_forged_and_unpermitted_requests(tmp_path: Path) -> None:
    acl = tmp_path / "acl.json"
    acl.write_text(json.dumps(ACCOUNTS))
    with running_cluster(tmp_path / "c", name_servers=1, acl=acl) as c:
        master = c.addr("broker-a-master")

        async def t() -> None:
            anon, prod = RawClient(), RawClient(PRODUCER)
            cons, admin = RawClient(CONSUMER), RawClient(ADMIN)
            forger = RawClient((PRODUCER[0], "not-the-secret"))
            stranger = RawClient(("nobodyKey1", "whatever1"))
            try:
                r = await anon.send(master, "AclTopic", b"x")
                assert r.code == R.NO_PERMISSION and "not signed" in (r.remark or "")
                r = await forger.send(master, "AclTopic", b"x")
                assert r.code == R.NO_PERMISSION and "signature" in (r.remark or "")
                # A body changed after signing no longer matches its signature.
                h = SendMessageRequestHeader("pg", "AclTopic", 0, 0)
                cmd = sign_command(request(C.SEND_MESSAGE, h.fields(), b"good"), *PRODUCER)
                cmd.body = b"evil"
                r = await prod.remoting.invoke(master, cmd, 5)
                assert r.code == R.NO_PERMISSION and "signature" in (r.remark or "")
                r = await stranger.send(master, "AclTopic", b"x")
                assert r.code == R.NO_PERMISSION and "no account" in (r.remark or "")

                assert (await prod.send(master, "AclTopic", b"ok")).code == R.SUCCESS
                r = await prod.send(master, "OtherTopic", b"x")
                assert r.code == R.NO_PERMISSION and "OtherTopic" in (r.remark or "")
                resp, _ = await prod.pull(master, "AclTopic", 0, 0, group="AclGroup")
                assert resp.code == R.NO_PERMISSION
                resp, _ = await cons.pull(master, "AclTopic", 0, 0, group="AclGroup")
                assert resp.code in (R.SUCCESS, R.PULL_NOT_FOUND), resp.remark
                resp, _ = await cons.pull(master, "AclTopic", 0, 0, group="OtherGroup")
                assert resp.code == R.NO_PERMISSION and "OtherGroup" in (resp.remark or "")
                assert (await cons.send(master, "AclTopic", b"x")).code == R.NO_PERMISSION

                create = CreateTopicRequestHeader("AdminMade", 2, 2).fields()
                r = await prod.call(master, C.UPDATE_AND_CREATE_TOPIC, create)
                assert r.code == R.NO_PERMISSION and "admin" in (r.remark or "")
                assert (await admin.call(master, C.UPDATE_AND_CREATE_TOPIC, create)).code == 0
                assert (await admin.send(master, "AdminMade", b"x")).code == R.SUCCESS
            finally:
                for client in (anon, prod, cons, admin, forger, stranger):
                    await client.close()

        asyncio.run(t())
        # The CLI signs its own probes with the admin account; the slave syncs signed too.
        status = c.status()
        assert status["ok"], status
        slave = next(n for n in status["nodes"] if n["name"] == "broker-a-slave")
        assert slave["runtime"]["haConnected"] == "True"
