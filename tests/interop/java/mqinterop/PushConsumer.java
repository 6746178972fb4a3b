package mqinterop;

import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;
import java.util.regex.Pattern;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.MessageSelector;
import org.apache.rocketmq.client.consumer.rebalance.AllocateMessageQueueAveragely;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.protocol.heartbeat.MessageModel;

/**
 * The official DefaultMQPushConsumer, one run: --namesrv --group --topic, optional --sub (a
 * tag expression, default *), --sql (a SQL92 selector instead), --model
 * clustering|broadcasting, --fail REGEX (bodies matching it answer RECONSUME_LATER every
 * time), --max-reconsume N, --expect N (stop after N deliveries whose body does not match
 * --fail), --expect-failed N (and after N deliveries answered RECONSUME_LATER; shutdown then
 * waits for their send-back), --idle-ms (stop after so long with no delivery; default 15000),
 * --access-key / --secret-key, --quiet true (the summary only). One JSON line per delivery
 * (the message and the listener's answer), then a summary, whose "seconds" run from the start
 * ("start_ms", epoch ms) to the last delivery. The process ends by itself: it is the Python
 * test that decides what was right.
 */
public final class PushConsumer {
    public static void main(String[] argv) throws Exception {
        Args args = new Args(argv);
        DefaultMQPushConsumer consumer = new DefaultMQPushConsumer(args.need("group"), Clients.aclHook(args),
            new AllocateMessageQueueAveragely());
        consumer.setNamesrvAddr(args.need("namesrv"));
        consumer.setInstanceName("interop-" + ProcessHandle.current().pid());
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.setMessageModel("broadcasting".equals(args.get("model", "clustering"))
            ? MessageModel.BROADCASTING : MessageModel.CLUSTERING);
        consumer.setMaxReconsumeTimes(args.getInt("max-reconsume", 16));
        consumer.setConsumeMessageBatchMaxSize(1);
        String sql = args.get("sql", null);
        if (sql != null) {
            consumer.subscribe(args.need("topic"), MessageSelector.bySql(sql));
        } else {
            consumer.subscribe(args.need("topic"), args.get("sub", "*"));
        }
        Pattern fail = Pattern.compile(args.get("fail", "(?!)"));
        int expect = args.getInt("expect", Integer.MAX_VALUE);
        int expectFailed = args.getInt("expect-failed", 0);
        // The listener counts a delivery before it returns; the consume thread then records its
        // result (the offset to commit, or a send back for RECONSUME_LATER). Without a wait,
        // shutdown() commits the offsets before the last result is in: the broker then keeps
        // one queue's offset behind (seen under load in test_mqadmin's consumerProgress).
        consumer.setAwaitTerminationMillisWhenShutdown(10000);
        AtomicLong failedDeliveries = new AtomicLong();
        long idleMs = args.getInt("idle-ms", 15000);
        Set<String> good = ConcurrentHashMap.newKeySet();
        AtomicLong last = new AtomicLong(System.currentTimeMillis());
        AtomicLong deliveries = new AtomicLong();
        boolean quiet = Boolean.parseBoolean(args.get("quiet", "false"));
        AtomicLong lastNanos = new AtomicLong();
        consumer.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            ConsumeConcurrentlyStatus status = ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
            for (MessageExt m : msgs) {
                boolean failing = fail.matcher(new String(m.getBody(), StandardCharsets.UTF_8)).matches();
                if (failing) {
                    status = ConsumeConcurrentlyStatus.RECONSUME_LATER;
                }
                if (!quiet) {
                    Map<String, Object> row = Json.message(m);
                    row.put("answer", failing ? "RECONSUME_LATER" : "CONSUME_SUCCESS");
                    Json.emit(row);
                }
                if (!failing) {
                    good.add(m.getMsgId() + "@" + m.getQueueOffset());
                } else {
                    failedDeliveries.incrementAndGet();
                }
            }
            deliveries.addAndGet(msgs.size());
            last.set(System.currentTimeMillis());
            lastNanos.accumulateAndGet(System.nanoTime(), Math::max);
            return status;
        });
        long started = System.nanoTime();
        long startedMs = System.currentTimeMillis();
        consumer.start();
        Json.emit(Map.of("started", true));
        while ((good.size() < expect || failedDeliveries.get() < expectFailed)
                && System.currentTimeMillis() - last.get() < idleMs) {
            Thread.sleep(20);
        }
        // Offsets are committed to the broker every 5 s and at shutdown (persistAll), after
        // the consume threads have ended (setAwaitTerminationMillisWhenShutdown above).
        consumer.shutdown();
        Map<String, Object> done = new TreeMap<>();
        done.put("done", true);
        done.put("deliveries", deliveries.get());
        done.put("succeeded", good.size());
        done.put("seconds", Math.max(0, lastNanos.get() - started) / 1e9);
        done.put("start_ms", startedMs);
        Json.emit(done);
    }
}
