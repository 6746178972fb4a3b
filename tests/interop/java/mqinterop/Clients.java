package mqinterop;

import org.apache.rocketmq.acl.common.AclClientRPCHook;
import org.apache.rocketmq.acl.common.SessionCredentials;
import org.apache.rocketmq.remoting.RPCHook;

/** What every program shares: the ACL hook from --access-key/--secret-key, if given. */
final class Clients {
    private Clients() {}

    static RPCHook aclHook(Args args) {
        String ak = args.get("access-key", null);
        return ak == null ? null : new AclClientRPCHook(new SessionCredentials(ak, args.need("secret-key")));
    }
}
