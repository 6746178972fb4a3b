package mqinterop;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/** `--name value` command-line options; a name given twice keeps every value. */
final class Args {
    private final Map<String, List<String>> values = new HashMap<>();

    Args(String[] argv) {
        for (int i = 0; i < argv.length; i++) {
            if (!argv[i].startsWith("--") || i + 1 >= argv.length) {
                throw new IllegalArgumentException("expected --name value pairs, got " + argv[i]);
            }
            values.computeIfAbsent(argv[i].substring(2), k -> new ArrayList<>()).add(argv[++i]);
        }
    }

    String get(String name, String otherwise) {
        List<String> v = values.get(name);
        return v == null ? otherwise : v.get(v.size() - 1);
    }

    String need(String name) {
        String v = get(name, null);
        if (v == null) {
            throw new IllegalArgumentException("--" + name + " is required");
        }
        return v;
    }

    int getInt(String name, int otherwise) {
        return Integer.parseInt(get(name, Integer.toString(otherwise)));
    }

    List<String> all(String name) {
        return values.getOrDefault(name, List.of());
    }
}
