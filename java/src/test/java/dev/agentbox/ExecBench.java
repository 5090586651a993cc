package dev.agentbox;

import io.fabric8.kubernetes.client.KubernetesClient;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.stream.Collectors;

/**
 * The Java client's one-shot exec figure, as benches/exec.rs measures Rust's and
 * benches/sdk_python.py Python's: {@code n} execs of {@code true} under the lossless frame, after
 * a warm-up, on one client. Prints one JSON line, {@code {"oneshot_ms": [...]}}, then p50/p95 on
 * stderr.
 *
 * <pre>java -cp ... dev.agentbox.ExecBench NAMESPACE POD CONTAINER N</pre>
 */
public final class ExecBench {
  private ExecBench() {}

  /** {@code -Dbench.bare=true}: without the frame. */
  static final boolean BARE = Boolean.getBoolean("bench.bare");

  public static void main(String[] args) {
    if (args.length != 4) {
      System.err.println("usage: ExecBench NAMESPACE POD CONTAINER N");
      System.exit(2);
    }
    String ns = args[0];
    String pod = args[1];
    String container = args[2];
    int n = Integer.parseInt(args[3]);
    try (KubernetesClient client = Clients.kubernetesClient()) {
      Kube kube = new Kube(client);
      for (int i = 0; i < 5; i++) {
        once(kube, ns, pod, container);
      }
      List<Double> ms = new ArrayList<>();
      for (int i = 0; i < n; i++) {
        long t = System.nanoTime();
        once(kube, ns, pod, container);
        ms.add((System.nanoTime() - t) / 1e6);
      }
      System.out.println("{\"oneshot_ms\": [" + ms.stream()
          .map(d -> String.format(Locale.ROOT, "%.3f", d)).collect(Collectors.joining(", ")) + "]}");
      List<Double> sorted = ms.stream().sorted().toList();
      System.err.printf(Locale.ROOT, "java one-shot exec `true`: p50 %.2f ms, p95 %.2f ms (n=%d)%n",
          pct(sorted, 50), pct(sorted, 95), n);
      if (BARE) {
        List<Double> c = CONNECT_MS.stream().sorted().toList();
        System.err.printf(Locale.ROOT, "  of which the WebSocket's opening: p50 %.2f ms%n", pct(c, 50));
      }
    }
  }

  /** A bare exec of {@code true} (no frame), to see what the frame costs. */
  static final List<Double> CONNECT_MS = new ArrayList<>();

  static void bare(Kube kube, String ns, String pod, String container) {
    long t0 = System.nanoTime();
    try (Exec.Conn c = Exec.connect(kube, ns, pod, container, java.util.List.of("true"))) {
      CONNECT_MS.add((System.nanoTime() - t0) / 1e6);
      while (true) {
        byte[] m = Exec.payloadOf(c.events.poll(30, java.util.concurrent.TimeUnit.SECONDS));
        if (m == null) {
          throw new IllegalStateException("no status");
        }
        if (m.length > 0 && m[0] == Wire.STATUS_CHANNEL) {
          return;
        }
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException(e);
    }
  }

  static void once(Kube kube, String ns, String pod, String container) {
    if (BARE) {
      bare(kube, ns, pod, container);
      return;
    }
    ExecResult r = Exec.run(kube, ns, pod, container, ExecOptions.argv("true"));
    if (!r.ok()) {
      throw new IllegalStateException("true failed: " + r.exitCode());
    }
  }

  /** The percentile as benches/common's p50_p95 picks it: index round((len - 1) * q). */
  static double pct(List<Double> sorted, int p) {
    if (sorted.isEmpty()) {
      return Double.NaN;
    }
    return sorted.get((int) Math.round((sorted.size() - 1) * (p / 100.0)));
  }
}
