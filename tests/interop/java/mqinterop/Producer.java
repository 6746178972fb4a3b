package mqinterop;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendCallback;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageClientIDSetter;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * The official DefaultMQProducer, one run: --namesrv --topic --count, --mode
 * sync|async|oneway|batch|ordered (default sync), optional --group, --tags, --keys (a prefix:
 * message i gets key PREFIX-i), --prop k=v (repeatable), --delay-level, --size (body bytes,
 * padded), --batch (messages per batch), --shards (ordered: message i goes to queue i % shards
 * by a MessageQueueSelector), --threads (sync sends from N threads), --quiet true (summary
 * only), --access-key/--secret-key. Body of message i: "body-i" (padded with 'x' to --size).
 * For benchmarks (sync and batch modes): --warmup N (N sync sends before the clock starts, not
 * counted or reported) and --seconds S (stop after S seconds, or at --count, whichever comes
 * first; a failed batch is then counted and reported as sync mode's sends are, not fatal);
 * with --seconds the summary also gives "sent" (messages acknowledged in the timed
 * part), "start_ms" (the clock's start, epoch ms), "timed_s" (from there to the last
 * acknowledgement) and the latency of each send (a batch: of the whole batch) as "p50_ms" and
 * "p99_ms".
 * One JSON line per message (i, status, msgId, broker, queueId, queueOffset), then a summary.
 */
public final class Producer {
    public static void main(String[] argv) throws Exception {
        Args args = new Args(argv);
        DefaultMQProducer producer = new DefaultMQProducer(args.get("group", "interop_producer"), Clients.aclHook(args));
        producer.setNamesrvAddr(args.need("namesrv"));
        producer.setInstanceName("interop-" + ProcessHandle.current().pid());
        producer.setSendMsgTimeout(args.getInt("timeout-ms", 10000));
        producer.start();
        String mode = args.get("mode", "sync");
        int count = args.getInt("count", 10);
        boolean quiet = Boolean.parseBoolean(args.get("quiet", "false"));
        AtomicInteger failed = new AtomicInteger();
        try {
            for (int i = 0; i < args.getInt("warmup", 0); i++) {
                producer.send(message(args, i));
            }
        } catch (Exception e) {
            producer.shutdown(); // its threads would keep the JVM alive
            throw e;
        }
        Clock clock = new Clock(args.get("seconds", null));
        long start = clock.start;
        try {
            switch (mode) {
                case "sync" -> sendSync(producer, args, count, quiet, failed, clock);
                case "async" -> sendAsync(producer, args, count, quiet, failed);
                case "oneway" -> {
                    for (int i = 0; i < count; i++) {
                        Message m = message(args, i);
                        producer.sendOneway(m);
                        report(i, "ONEWAY", MessageClientIDSetter.getUniqID(m), null, quiet);
                    }
                }
                case "batch" -> {
                    int size = args.getInt("batch", 16);
                    for (int from = 0; from < count && clock.running(); from += size) {
                        List<Message> batch = new ArrayList<>();
                        for (int i = from; i < Math.min(count, from + size); i++) {
                            batch.add(message(args, i));
                        }
                        long t = System.nanoTime();
                        SendResult r;
                        try {
                            r = producer.send(batch);
                        } catch (Exception e) {
                            if (!clock.timed()) {
                                throw e;
                            }
                            failed.addAndGet(batch.size()); // a timed run goes on, as sync mode's
                            error(from, e);
                            continue;
                        }
                        clock.acked(batch.size(), t);
                        String[] ids = r.getMsgId().split(",");
                        for (int k = 0; k < batch.size(); k++) {
                            report(from + k, r.getSendStatus().name(), ids[k], r, quiet, k);
                        }
                    }
                }
                case "ordered" -> {
                    int shards = args.getInt("shards", 2);
                    for (int i = 0; i < count; i++) {
                        SendResult r = producer.send(message(args, i),
                            (mqs, msg, key) -> mqs.get((Integer) key % mqs.size()), i % shards);
                        report(i, r.getSendStatus().name(), r.getMsgId(), r, quiet);
                    }
                }
                default -> throw new IllegalArgumentException("unknown --mode " + mode);
            }
        } finally {
            producer.shutdown();
        }
        Map<String, Object> done = new TreeMap<>();
        done.put("done", true);
        done.put("count", count);
        done.put("failed", failed.get());
        done.put("seconds", (System.nanoTime() - start) / 1e9);
        clock.summarize(done);
        Json.emit(done);
    }

    static Message message(Args args, int i) {
        StringBuilder body = new StringBuilder("body-" + i);
        int size = args.getInt("size", 0);
        while (body.length() < size) {
            body.append('x');
        }
        Message m = new Message(args.need("topic"), body.toString().getBytes(StandardCharsets.UTF_8));
        String tags = args.get("tags", null);
        if (tags != null) {
            m.setTags(tags);
        }
        String keys = args.get("keys", null);
        if (keys != null) {
            m.setKeys(keys + "-" + i);
        }
        for (String kv : args.all("prop")) {
            String[] p = kv.split("=", 2);
            m.putUserProperty(p[0], p[1]);
        }
        int delay = args.getInt("delay-level", 0);
        if (delay > 0) {
            m.setDelayTimeLevel(delay);
        }
        return m;
    }

    static void sendSync(DefaultMQProducer producer, Args args, int count, boolean quiet, AtomicInteger failed,
            Clock clock) throws InterruptedException {
        int threads = args.getInt("threads", 1);
        AtomicInteger next = new AtomicInteger();
        Thread[] workers = new Thread[threads];
        for (int t = 0; t < threads; t++) {
            workers[t] = new Thread(() -> {
                for (int i = next.getAndIncrement(); i < count && clock.running(); i = next.getAndIncrement()) {
                    try {
                        long sentAt = System.nanoTime();
                        SendResult r = producer.send(message(args, i));
                        clock.acked(1, sentAt);
                        report(i, r.getSendStatus().name(), r.getMsgId(), r, quiet);
                    } catch (Exception e) {
                        failed.incrementAndGet();
                        error(i, e);
                    }
                }
            });
            workers[t].start();
        }
        for (Thread w : workers) {
            w.join();
        }
    }

    static void sendAsync(DefaultMQProducer producer, Args args, int count, boolean quiet, AtomicInteger failed)
            throws Exception {
        CountDownLatch latch = new CountDownLatch(count);
        for (int i = 0; i < count; i++) {
            final int n = i;
            producer.send(message(args, i), new SendCallback() {
                @Override
                public void onSuccess(SendResult r) {
                    report(n, r.getSendStatus().name(), r.getMsgId(), r, quiet);
                    latch.countDown();
                }

                @Override
                public void onException(Throwable e) {
                    failed.incrementAndGet();
                    error(n, e);
                    latch.countDown();
                }
            });
        }
        if (!latch.await(60, TimeUnit.SECONDS)) {
            throw new IllegalStateException("async sends unanswered after 60 s: " + latch.getCount());
        }
    }

    static void report(int i, String status, String msgId, SendResult r, boolean quiet) {
        report(i, status, msgId, r, quiet, 0);
    }

    /** For a batch, the k-th message's offset is the batch's first offset + k. */
    static void report(int i, String status, String msgId, SendResult r, boolean quiet, int k) {
        if (quiet) {
            return;
        }
        Map<String, Object> row = new TreeMap<>();
        row.put("i", i);
        row.put("status", status);
        row.put("msgId", msgId);
        if (r != null) {
            MessageQueue q = r.getMessageQueue();
            row.put("broker", q.getBrokerName());
            row.put("queueId", q.getQueueId());
            row.put("queueOffset", r.getQueueOffset() + k);
            row.put("offsetMsgId", r.getOffsetMsgId() == null ? null : Arrays.asList(r.getOffsetMsgId().split(",")).get(k));
        }
        Json.emit(row);
    }

    /** The timed part of a --seconds run: its deadline, acknowledged messages and latencies. */
    static final class Clock {
        final long start = System.nanoTime();
        final long startMs = System.currentTimeMillis();
        final long deadline;
        final AtomicInteger sent = new AtomicInteger();
        final AtomicLong lastAck = new AtomicLong();
        final ConcurrentLinkedQueue<Long> latencies = new ConcurrentLinkedQueue<>();

        Clock(String seconds) {
            deadline = seconds == null ? Long.MAX_VALUE : start + (long) (Double.parseDouble(seconds) * 1e9);
        }

        boolean timed() {
            return deadline != Long.MAX_VALUE;
        }

        boolean running() {
            return !timed() || System.nanoTime() < deadline;
        }

        void acked(int messages, long sentAt) {
            if (timed()) {
                long now = System.nanoTime();
                latencies.add(now - sentAt);
                sent.addAndGet(messages);
                lastAck.accumulateAndGet(now, Math::max);
            }
        }

        void summarize(Map<String, Object> done) {
            if (!timed() || latencies.isEmpty()) {
                return;
            }
            long[] lat = latencies.stream().mapToLong(Long::longValue).sorted().toArray();
            done.put("sent", sent.get());
            done.put("timed_s", (lastAck.get() - start) / 1e9);
            done.put("start_ms", startMs);
            done.put("p50_ms", lat[lat.length / 2] / 1e6);
            done.put("p99_ms", lat[Math.min(lat.length - 1, (int) (lat.length * 0.99))] / 1e6);
        }
    }

    static void error(int i, Throwable e) {
        Map<String, Object> row = new TreeMap<>();
        row.put("i", i);
        row.put("error", e.toString());
        Json.emit(row);
    }
}
