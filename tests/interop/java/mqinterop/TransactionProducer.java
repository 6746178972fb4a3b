package mqinterop;

import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.client.producer.TransactionSendResult;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;

/**
 * The official TransactionMQProducer, one run: --namesrv --topic --group, then one
 * --tx BODY=EXECUTE[/CHECK] per message, where EXECUTE is what the local transaction answers
 * (COMMIT_MESSAGE, ROLLBACK_MESSAGE or UNKNOW) and CHECK what a check-back of it answers
 * (default UNKNOW); --await-checks N keeps the producer up after sending until it has
 * answered N check-backs (at most --linger-ms, default 60000). One JSON line per send (body, msgId, offsetMsgId, queueId,
 * queueOffset, state) and per check-back (check: body, answer), then a summary.
 */
public final class TransactionProducer {
    public static void main(String[] argv) throws Exception {
        Args args = new Args(argv);
        Map<String, String> execute = new TreeMap<>();
        Map<String, String> check = new ConcurrentHashMap<>();
        AtomicInteger checks = new AtomicInteger();
        for (String tx : args.all("tx")) {
            String[] kv = tx.split("=", 2);
            String[] answers = kv[1].split("/", 2);
            execute.put(kv[0], answers[0]);
            check.put(kv[0], answers.length > 1 ? answers[1] : "UNKNOW");
        }
        TransactionMQProducer producer = new TransactionMQProducer(args.need("group"), Clients.aclHook(args));
        producer.setNamesrvAddr(args.need("namesrv"));
        producer.setInstanceName("interop-" + ProcessHandle.current().pid());
        producer.setSendMsgTimeout(args.getInt("timeout-ms", 10000));
        producer.setTransactionListener(new TransactionListener() {
            @Override
            public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                return LocalTransactionState.valueOf(execute.get(body(msg)));
            }

            @Override
            public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                String answer = check.getOrDefault(body(msg), "UNKNOW");
                Map<String, Object> row = new TreeMap<>();
                row.put("check", body(msg));
                row.put("answer", answer);
                row.put("msgId", msg.getMsgId());
                row.put("checkTimes", msg.getProperty("TRANSACTION_CHECK_TIMES"));
                Json.emit(row);
                checks.incrementAndGet();
                return LocalTransactionState.valueOf(answer);
            }
        });
        producer.start();
        try {
            run(producer, args, execute.keySet(), checks);
        } finally {
            producer.shutdown();
        }
        Json.emit(Map.of("done", true));
    }

    static void run(TransactionMQProducer producer, Args args, Iterable<String> bodies, AtomicInteger checks)
            throws Exception {
        for (String body : bodies) {
            Message m = new Message(args.need("topic"), "TxTag", body, body.getBytes(StandardCharsets.UTF_8));
            TransactionSendResult r = producer.sendMessageInTransaction(m, null);
            Map<String, Object> row = new TreeMap<>();
            row.put("body", body);
            row.put("msgId", r.getMsgId());
            row.put("offsetMsgId", r.getOffsetMsgId());
            row.put("queueId", r.getMessageQueue().getQueueId());
            row.put("queueOffset", r.getQueueOffset());
            row.put("status", r.getSendStatus().name());
            row.put("state", r.getLocalTransactionState().name());
            Json.emit(row);
        }
        long until = System.currentTimeMillis() + args.getInt("linger-ms", 60000);
        int wanted = args.getInt("await-checks", 0);
        while (checks.get() < wanted && System.currentTimeMillis() < until) {
            Thread.sleep(20);
        }
    }

    static String body(Message m) {
        return new String(m.getBody(), StandardCharsets.UTF_8);
    }
}
