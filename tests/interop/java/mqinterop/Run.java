package mqinterop;

import java.lang.reflect.InvocationTargetException;
import java.util.Arrays;

/**
 * `Run CLASS ARGS...`: CLASS's main (one of the programs here, or mqadmin's MQAdminStartup),
 * then the JVM's end as soon as it returns, with its exit code (1 if it threw).
 *
 * A client's shutdown() ends with a round trip to each broker (the client's unregistration),
 * on the connections its oneway requests (offset commits, transaction ends, oneway sends) went
 * out on before it, so when main returns the brokers have them. Netty's event loops, shut down
 * gracefully, would keep the JVM alive about 3 s longer (their quiet period is 2 s): most of a
 * short program's run (mqadmin's clusterList took 4 s, 1 s this way), and the tests run many.
 */
public final class Run {
    private Run() {}

    public static void main(String[] argv) throws Exception {
        int code = 0;
        try {
            Class.forName(argv[0])
                .getMethod("main", String[].class)
                .invoke(null, (Object) Arrays.copyOfRange(argv, 1, argv.length));
        } catch (InvocationTargetException e) {
            System.err.print("Exception in thread \"main\" "); // as the JVM would print it
            e.getCause().printStackTrace();
            code = 1;
        }
        System.out.flush();
        System.exit(code);
    }
}
