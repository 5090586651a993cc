package dev.agentbox;

import static org.junit.jupiter.api.Assertions.fail;

import io.fabric8.kubernetes.api.model.GenericKubernetesResource;
import io.fabric8.kubernetes.api.model.NamespaceBuilder;
import io.fabric8.kubernetes.client.KubernetesClient;
import io.fabric8.kubernetes.client.dsl.base.PatchContext;
import io.fabric8.kubernetes.client.dsl.base.PatchType;
import java.io.File;
import java.io.IOException;
import java.io.InputStream;
import java.net.ServerSocket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

/**
 * The set-up of the tests on the real cluster, as tests/common/mod.rs and the Python SDK's
 * conftest do it: the cluster of {@code KUBECONFIG} (from {@code hack/cluster env}), a namespace
 * of its own, and an operator process (the debug build of {@code agentbox-operator}) watching
 * only that namespace with a {@code file://} snapshot store. Every process started here is
 * stopped by its handle; the sandboxes, the namespace and the store directory are removed at the
 * end, also when a test fails.
 */
final class ClusterEnv implements AutoCloseable {
  static final String BASE_IMAGE = "docker.io/library/busybox:1.37";
  static final Path STORE_ROOT = Path.of("/var/lib/agentbox/test-snapshots");
  static final Path NODE_ROOT = Path.of("/var/lib/agentbox/workspaces");
  static final Path REPO = Path.of(System.getProperty("agentbox.repo", "..")).toAbsolutePath().normalize();

  final KubernetesClient client;
  final String ns;
  final Sandboxes sandboxes;
  final Path store;
  final List<Process> operators = new ArrayList<>();
  final List<File> logs = new ArrayList<>();

  static Path targetDir() {
    String t = System.getenv("CARGO_TARGET_DIR");
    if (t != null && !t.isEmpty()) {
      return Path.of(t);
    }
    String cache = System.getenv("AGENTBOX_CACHE");
    return cache != null ? Path.of(cache, "target") : Path.of(System.getProperty("user.home"), ".cache", "agentbox", "target");
  }

  /** A debug binary of this repository (hack/test builds them). */
  static Path binary(String name, String env) {
    String p = System.getenv(env);
    Path path = p != null && !p.isEmpty() ? Path.of(p) : targetDir().resolve("debug").resolve(name);
    if (!path.toFile().canExecute()) {
      fail(path + " is missing: run `cargo build --bin " + name + "` (hack/test does) or set $" + env);
    }
    return path;
  }

  ClusterEnv(String module) {
    if (System.getenv("KUBECONFIG") == null || System.getenv("KUBECONFIG").isEmpty()) {
      fail("no cluster: run `eval \"$(hack/cluster env)\"` or use hack/test");
    }
    client = Clients.kubernetesClient();
    ensureCrds();
    byte[] r = new byte[3];
    new java.security.SecureRandom().nextBytes(r);
    ns = "java-" + module + "-" + HexFormat.of().formatHex(r);
    client.namespaces().resource(new NamespaceBuilder().withNewMetadata().withName(ns).endMetadata().build()).create();
    // Pods need the namespace's default ServiceAccount, made by the controller-manager.
    client.serviceAccounts().inNamespace(ns).withName("default").waitUntilCondition(sa -> sa != null, 60, TimeUnit.SECONDS);
    sandboxes = Sandboxes.using(client, ns);
    store = STORE_ROOT.resolve(ns);
    startOperator();
  }

  void ensureCrds() {
    try (InputStream in = java.nio.file.Files.newInputStream(REPO.resolve("crds/agentbox.yaml"))) {
      client.load(in).fieldManager("agentbox-tests").forceConflicts().serverSideApply();
    } catch (IOException e) {
      fail("reading crds/agentbox.yaml: " + e);
    }
    for (String n : List.of("sandboxes", "sandboxsnapshots", "sandboxtemplates", "sandboxpools")) {
      client.apiextensions().v1().customResourceDefinitions().withName(n + ".agentbox.dev").waitUntilCondition(
          crd -> crd != null && crd.getStatus() != null && crd.getStatus().getConditions().stream()
              .anyMatch(c -> "Established".equals(c.getType()) && "True".equals(c.getStatus())),
          60, TimeUnit.SECONDS);
    }
  }

  static int freePort() {
    try (ServerSocket s = new ServerSocket(0, 1, java.net.InetAddress.getLoopbackAddress())) {
      return s.getLocalPort();
    } catch (IOException e) {
      throw new IllegalStateException(e);
    }
  }

  void startOperator() {
    try {
      File log = File.createTempFile("agentbox-java-" + ns + "-", ".log");
      ProcessBuilder pb = new ProcessBuilder(
          binary("agentbox-operator", "AGENTBOX_OPERATOR_BIN").toString(),
          "--namespace", ns,
          "--identity", "op-" + ns + "-" + operators.size(),
          "--metrics-addr", "127.0.0.1:" + freePort(),
          "--lease-seconds", "10",
          "--store-url", "file://" + store,
          "--store-prefix", "snaps");
      pb.redirectErrorStream(true).redirectOutput(log).redirectInput(ProcessBuilder.Redirect.from(new File("/dev/null")));
      Map<String, String> env = pb.environment();
      env.putIfAbsent("RUST_LOG", "info,agentbox=debug");
      // The trusted image of its node-side pods (hack/cluster up imports it).
      if (env.get("AGENTBOX_HELPER_IMAGE") == null || env.get("AGENTBOX_HELPER_IMAGE").isEmpty()) {
        env.put("AGENTBOX_HELPER_IMAGE", "docker.io/agentbox/helper:dev");
      }
      operators.add(pb.start());
      logs.add(log);
    } catch (IOException e) {
      fail("starting the operator: " + e);
    }
  }

  /** Every operator's log tail, for failure messages. */
  String logTail() {
    StringBuilder b = new StringBuilder();
    for (File f : logs) {
      try {
        List<String> l = java.nio.file.Files.readAllLines(f.toPath(), StandardCharsets.UTF_8);
        b.append("--- ").append(f).append(" ---\n");
        l.subList(Math.max(0, l.size() - 40), l.size()).forEach(x -> b.append(x).append('\n'));
      } catch (IOException e) {
        b.append("(no log ").append(f).append(")\n");
      }
    }
    return b.toString();
  }

  /** A Ready sandbox of a scope of its own. */
  SandboxHandle ready(Scope scope) {
    SandboxHandle s = sandboxes.getOrCreate(scope, SandboxSpec.image(BASE_IMAGE).imagePullPolicy("Never"));
    try {
      return s.waitReady(180_000);
    } catch (SandboxNotReadyException e) {
      throw new AssertionError(e.getMessage() + "\n" + logTail(), e);
    }
  }

  /**
   * Deletes every SandboxSnapshot and Sandbox while the operator runs (its finalizers remove
   * stored objects, pods and workspaces), stops the operators, removes what is left's
   * finalizers, deletes the namespace, the store directory and the namespace's workspaces.
   */
  @Override
  public void close() {
    List<io.fabric8.kubernetes.client.dsl.base.ResourceDefinitionContext> kinds = List.of(Kube.SNAPSHOTS, Kube.SANDBOXES);
    try {
      for (var c : kinds) {
        client.genericKubernetesResources(c).inNamespace(ns).delete();
      }
      long deadline = System.nanoTime() + TimeUnit.MINUTES.toNanos(3);
      while (System.nanoTime() < deadline) {
        boolean any = false;
        for (var c : kinds) {
          any |= !client.genericKubernetesResources(c).inNamespace(ns).list().getItems().isEmpty();
        }
        if (!any) {
          break;
        }
        Thread.sleep(200);
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    } catch (RuntimeException e) {
      System.err.println("teardown of " + ns + ": " + e);
    } finally {
      for (Process p : operators) {
        p.destroy();
        try {
          if (!p.waitFor(10, TimeUnit.SECONDS)) {
            p.destroyForcibly().waitFor();
          }
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
        }
      }
      for (File f : logs) {
        f.delete();
      }
      try {
        for (var c : kinds) { // nobody runs the finalizers any more
          for (GenericKubernetesResource o : client.genericKubernetesResources(c).inNamespace(ns).list().getItems()) {
            client.genericKubernetesResources(c).inNamespace(ns).withName(o.getMetadata().getName())
                .patch(new PatchContext.Builder().withPatchType(PatchType.JSON_MERGE).build(), "{\"metadata\":{\"finalizers\":null}}");
          }
        }
        client.namespaces().withName(ns).delete();
      } finally {
        deleteTree(store.toFile());
        deleteTree(NODE_ROOT.resolve(ns).toFile());
        client.close();
      }
    }
  }

  static void deleteTree(File f) {
    File[] children = f.isDirectory() && !java.nio.file.Files.isSymbolicLink(f.toPath()) ? f.listFiles() : null;
    if (children != null) {
      for (File c : children) {
        deleteTree(c);
      }
    }
    f.delete();
  }

  /** Runs the Rust CLI ({@code agentbox -n NS ...}); exit code and output. */
  Object[] cli(String... args) throws IOException, InterruptedException {
    List<String> argv = new ArrayList<>(List.of(binary("agentbox", "AGENTBOX_CLI_BIN").toString(), "-n", ns));
    argv.addAll(List.of(args));
    Process p = new ProcessBuilder(argv).redirectErrorStream(true).start();
    byte[] out = p.getInputStream().readAllBytes();
    return new Object[] {p.waitFor(), new String(out, StandardCharsets.UTF_8)};
  }
}
