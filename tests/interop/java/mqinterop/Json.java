package mqinterop;

import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.TreeMap;
import org.apache.rocketmq.common.message.MessageExt;
import com.alibaba.fastjson.JSON;

/** One JSON object per line on stdout, which the Python tests read. */
final class Json {
    private Json() {}

    static synchronized void emit(Map<String, Object> row) {
        System.out.println(JSON.toJSONString(row));
        System.out.flush();
    }

    /** A received message as both sides can compare it: body, ids, queue, offset, properties. */
    static Map<String, Object> message(MessageExt m) {
        Map<String, Object> row = new TreeMap<>();
        row.put("msgId", m.getMsgId());
        row.put("topic", m.getTopic());
        row.put("tags", m.getTags());
        row.put("keys", m.getKeys());
        row.put("body", new String(m.getBody(), StandardCharsets.UTF_8));
        row.put("queueId", m.getQueueId());
        row.put("queueOffset", m.getQueueOffset());
        row.put("commitLogOffset", m.getCommitLogOffset());
        row.put("reconsumeTimes", m.getReconsumeTimes());
        row.put("bornTimestamp", m.getBornTimestamp());
        row.put("storeTimestamp", m.getStoreTimestamp());
        row.put("properties", new TreeMap<>(m.getProperties()));
        return row;
    }
}
