package mqinterop;

import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageExt;

/**
 * The official DefaultLitePullConsumer (subscribe mode), one run: --namesrv --group --topic,
 * optional --sub (tag expression), --expect N, --idle-ms, --auto-commit true|false (false:
 * commitSync() after each poll), --access-key/--secret-key. One JSON line per message, then
 * a summary.
 */
public final class LitePullConsumer {
    public static void main(String[] argv) throws Exception {
        Args args = new Args(argv);
        DefaultLitePullConsumer consumer = new DefaultLitePullConsumer(args.need("group"), Clients.aclHook(args));
        consumer.setNamesrvAddr(args.need("namesrv"));
        consumer.setInstanceName("interop-" + ProcessHandle.current().pid());
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        boolean autoCommit = Boolean.parseBoolean(args.get("auto-commit", "false"));
        consumer.setAutoCommit(autoCommit);
        consumer.subscribe(args.need("topic"), args.get("sub", "*"));
        consumer.start();
        int expect = args.getInt("expect", Integer.MAX_VALUE);
        long idleMs = args.getInt("idle-ms", 15000);
        long last = System.currentTimeMillis();
        int received = 0;
        while (received < expect && System.currentTimeMillis() - last < idleMs) {
            List<MessageExt> msgs = consumer.poll(200);
            for (MessageExt m : msgs) {
                Json.emit(Json.message(m));
            }
            if (!msgs.isEmpty()) {
                received += msgs.size();
                last = System.currentTimeMillis();
                if (!autoCommit) {
                    consumer.commitSync();
                }
            }
        }
        consumer.shutdown();
        Map<String, Object> done = new TreeMap<>();
        done.put("done", true);
        done.put("received", received);
        Json.emit(done);
    }
}
