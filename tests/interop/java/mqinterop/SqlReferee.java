package mqinterop;

import com.alibaba.fastjson.JSON;
import com.alibaba.fastjson.JSONObject;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;
import java.util.TreeMap;
import org.apache.rocketmq.broker.filter.MessageEvaluationContext;
import org.apache.rocketmq.common.filter.ExpressionType;
import org.apache.rocketmq.filter.FilterFactory;
import org.apache.rocketmq.filter.expression.Expression;

/**
 * Apache RocketMQ's own SQL92 filter as a referee: each stdin line is a JSON object
 * {"expr": "...", "props": {"k": "v", ...}}; each answer line says whether the broker's
 * compiler accepted the expression ("compiled") and, if it did, whether a message with those
 * properties matches, the way the broker decides it on pull (ExpressionMessageFilter: the
 * expression is evaluated over the message's properties; a null, non-boolean or failed
 * evaluation does not match).
 */
public final class SqlReferee {
    public static void main(String[] argv) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        for (String line = in.readLine(); line != null; line = in.readLine()) {
            JSONObject q = JSON.parseObject(line);
            Map<String, Object> row = new TreeMap<>();
            Expression compiled = null;
            try {
                compiled = FilterFactory.INSTANCE.get(ExpressionType.SQL92).compile(q.getString("expr"));
                row.put("compiled", true);
            } catch (Throwable e) {
                row.put("compiled", false);
                row.put("error", String.valueOf(e.getMessage()));
            }
            if (compiled != null) {
                Map<String, String> props = new HashMap<>();
                JSONObject p = q.getJSONObject("props");
                if (p != null) {
                    for (String k : p.keySet()) {
                        props.put(k, p.getString(k));
                    }
                }
                Object ret = null;
                try {
                    ret = compiled.evaluate(new MessageEvaluationContext(props));
                } catch (Throwable e) {
                    row.put("evalError", String.valueOf(e.getMessage()));
                }
                row.put("match", ret instanceof Boolean && (Boolean) ret);
            }
            Json.emit(row);
        }
    }
}
