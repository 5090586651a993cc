package dev.agentbox;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import io.fabric8.kubernetes.client.ConfigBuilder;
import io.fabric8.kubernetes.client.KubernetesClient;
import io.fabric8.kubernetes.client.KubernetesClientBuilder;
import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.api.function.Executable;

/**
 * Every failure the client raises is an {@link AgentboxException}: after close (its own kind,
 * before any request), against an API server that cannot be reached, from an interrupted
 * thread, and for bad input. Servers here are loopback sockets of the test's own.
 */
class FailuresTest {
  static final Scope SCOPE = Scope.forUser("coder", "alice@example.com");
  static final SandboxSpec SPEC = SandboxSpec.image("busybox");

  final List<AutoCloseable> cleanup = new ArrayList<>();

  @AfterEach
  void tearDown() throws Exception {
    for (AutoCloseable c : cleanup) {
      c.close();
    }
    Thread.interrupted(); // no test leaves its flag to the next
  }

  /** A loopback listener that counts connections and answers nothing (a request hangs). */
  static final class Silent implements AutoCloseable {
    final ServerSocket server = new ServerSocket(0, 50, java.net.InetAddress.getLoopbackAddress());
    final AtomicInteger accepted = new AtomicInteger();
    final List<Socket> held = new java.util.concurrent.CopyOnWriteArrayList<>();
    final Thread acceptor;

    Silent() throws IOException {
      acceptor = new Thread(() -> {
        while (!server.isClosed()) {
          try {
            held.add(server.accept());
            accepted.incrementAndGet();
          } catch (IOException e) {
            return;
          }
        }
      }, "silent-api-server");
      acceptor.setDaemon(true);
      acceptor.start();
    }

    String url() {
      return "http://127.0.0.1:" + server.getLocalPort();
    }

    @Override
    public void close() throws IOException {
      server.close();
      for (Socket s : held) {
        s.close();
      }
    }
  }

  /** A loopback port nothing listens on. */
  static String refusedUrl() throws IOException {
    try (ServerSocket s = new ServerSocket(0, 1, java.net.InetAddress.getLoopbackAddress())) {
      return "http://127.0.0.1:" + s.getLocalPort();
    }
  }

  static KubernetesClient client(String url) {
    return new KubernetesClientBuilder().withConfig(new ConfigBuilder()
        .withMasterUrl(url).withNamespace("team-a")
        .withRequestRetryBackoffLimit(0).withRequestTimeout(5_000).withConnectionTimeout(5_000)
        .build()).build();
  }

  static SandboxHandle sandboxOf(Sandboxes s) {
    Map<String, Object> body = new LinkedHashMap<>(SPEC.toMap());
    body.put("scope", SCOPE.toMap());
    return new SandboxHandle(s, Sandboxes.sandboxObject("sbx", SCOPE, body));
  }

  /** Every public call that reaches the cluster, by name. */
  static Map<String, Executable> calls(Sandboxes s, SandboxHandle sbx) {
    SandboxState st = SandboxState.of(IsolationKey.of(SCOPE), s.namespace());
    SandboxState snapped = st.withLastSnapshot("snap-1");
    Map<String, Executable> m = new LinkedHashMap<>();
    m.put("open", () -> s.open("sbx"));
    m.put("openScope", () -> s.openScope(SCOPE));
    m.put("list", () -> s.list(null));
    m.put("getOrCreate", () -> s.getOrCreate(SCOPE, SPEC));
    m.put("templates", s::templates);
    m.put("pools", s::pools);
    m.put("createRestored", () -> s.createRestored(SCOPE, SPEC, "snap-1", null));
    m.put("getSnapshot", () -> s.getSnapshot("snap-1"));
    m.put("waitSnapshot", () -> s.waitSnapshot("snap-1", 2_000));
    m.put("snapshots(scope)", () -> s.snapshots(SCOPE));
    m.put("guard.acquire", () -> s.guard(SCOPE, 0L, null).acquire());
    m.put("open(state)", () -> s.open(st, SPEC));
    m.put("persistWorkspace", () -> s.persistWorkspace(st, 2_000));
    m.put("hydrateWorkspace", () -> s.hydrateWorkspace(snapped, SPEC, 2_000));
    m.put("refresh", sbx::refresh);
    m.put("waitReady", () -> sbx.waitReady(2_000));
    m.put("recover", () -> sbx.recover(2_000));
    m.put("exec", () -> sbx.exec(ExecOptions.argv("true")));
    m.put("exec(shell)", () -> sbx.exec("true"));
    m.put("exec(stdin stream)", () -> sbx.exec(ExecOptions.argv("cat").stdin(new ByteArrayInputStream(new byte[10]))));
    m.put("session.run", () -> {
      try (Session ses = sbx.session()) {
        ses.run("true");
      }
    });
    m.put("read", () -> sbx.read("a"));
    m.put("write", () -> sbx.write("a", new byte[1]));
    m.put("write(mode)", () -> sbx.write("a", new byte[1], 0644));
    m.put("ls", () -> sbx.ls("."));
    m.put("stat", () -> sbx.stat("a"));
    m.put("exists", () -> sbx.exists("a"));
    m.put("rm", () -> sbx.rm("a", true));
    m.put("mkdir", () -> sbx.mkdir("a", true));
    m.put("uploadTar", () -> sbx.uploadTar("a", new ByteArrayInputStream(new byte[512])));
    m.put("downloadTar", () -> sbx.downloadTar("a", new ByteArrayOutputStream()));
    m.put("suspend", sbx::suspend);
    m.put("resume", sbx::resume);
    m.put("delete", () -> sbx.delete(true, 2_000));
    m.put("snapshot", () -> sbx.snapshot(null, true, 2_000));
    m.put("snapshots", sbx::snapshots);
    m.put("restore", () -> sbx.restore("snap-1", 2_000));
    m.put("sandbox.guard.acquire", () -> sbx.guard(0L).acquire());
    return m;
  }

  static Throwable thrown(String name, Executable e) {
    try {
      e.execute();
    } catch (Throwable t) {
      return t;
    }
    fail(name + " raised nothing");
    return null;
  }

  @Test
  void everyCallAfterCloseIsAClientClosedExceptionRaisedBeforeAnyRequest(@TempDir Path dir) throws Exception {
    try (Silent api = new Silent()) {
      Path kubeconfig = dir.resolve("kubeconfig");
      java.nio.file.Files.writeString(kubeconfig, "apiVersion: v1\nkind: Config\n"
          + "clusters: [{name: c, cluster: {server: '" + api.url() + "'}}]\n"
          + "contexts: [{name: c, context: {cluster: c, user: u, namespace: team-a}}]\n"
          + "current-context: c\nusers: [{name: u, user: {token: t}}]\n");
      String before = System.setProperty("kubeconfig", kubeconfig.toString());
      Sandboxes s;
      try {
        s = Sandboxes.connect(null); // its own client, closed by close()
      } finally {
        if (before == null) {
          System.clearProperty("kubeconfig");
        } else {
          System.setProperty("kubeconfig", before);
        }
      }
      assertEquals("team-a", s.namespace());
      SandboxHandle sbx = sandboxOf(s);
      Session opened = sbx.session();
      s.close();
      s.close(); // idempotent
      for (Map.Entry<String, Executable> c : calls(s, sbx).entrySet()) {
        Throwable t = thrown(c.getKey(), c.getValue());
        assertInstanceOf(ClientClosedException.class, t, c.getKey() + ": " + t);
      }
      assertInstanceOf(ClientClosedException.class, thrown("session.run", () -> opened.run("true")));
      opened.close();
      assertEquals(0, api.accepted.get(), "a closed client made no request");
    }
  }

  @Test
  void aClientClosedByItsOwnerIsAClientClosedExceptionToo() throws Exception {
    try (Silent api = new Silent()) {
      KubernetesClient k = client(api.url());
      Sandboxes s = Sandboxes.using(k, "team-a");
      k.close(); // by its owner: Sandboxes did not close it
      for (Map.Entry<String, Executable> c : calls(s, sandboxOf(s)).entrySet()) {
        Throwable t = thrown(c.getKey(), c.getValue());
        assertInstanceOf(ClientClosedException.class, t, c.getKey() + ": " + t);
      }
      assertEquals(0, api.accepted.get());
    }
  }

  @Test
  void anUnreachableApiServerIsATransportExceptionFromEveryCall() throws Exception {
    try (KubernetesClient k = client(refusedUrl())) {
      Sandboxes s = Sandboxes.using(k, "team-a");
      for (Map.Entry<String, Executable> c : calls(s, sandboxOf(s)).entrySet()) {
        Throwable t = thrown(c.getKey(), c.getValue());
        assertInstanceOf(TransportException.class, t, c.getKey() + ": " + t);
        assertFalse(Thread.currentThread().isInterrupted());
      }
    }
  }

  @Test
  void anInterruptedCallIsAnAgentboxInterruptedExceptionAndKeepsTheFlag() throws Exception {
    try (Silent api = new Silent(); KubernetesClient k = client(api.url())) {
      Sandboxes s = Sandboxes.using(k, "team-a");
      for (Map.Entry<String, Executable> c : calls(s, sandboxOf(s)).entrySet()) {
        Thread.currentThread().interrupt();
        Throwable t = thrown(c.getKey(), c.getValue());
        assertInstanceOf(AgentboxInterruptedException.class, t, c.getKey() + ": " + t);
        assertTrue(Thread.interrupted(), c.getKey() + " cleared the thread's interrupt flag");
      }
      // interrupted while it waits (the server never answers), not before
      Thread me = Thread.currentThread();
      Thread interrupter = new Thread(() -> {
        try {
          Thread.sleep(300);
        } catch (InterruptedException e) {
          return;
        }
        me.interrupt();
      });
      interrupter.start();
      Throwable t = thrown("open", () -> s.open("sbx"));
      assertTrue(Thread.interrupted()); // (cleared here, or join would raise it)
      interrupter.join();
      assertInstanceOf(AgentboxInterruptedException.class, t, String.valueOf(t));
    }
  }

  @Test
  void aGuardWaitingForAnApiServerOutOfReachIsInterruptedAsAnyWait() throws Exception {
    try (KubernetesClient k = client(refusedUrl())) {
      Guard g = Sandboxes.using(k, "team-a").guard(SCOPE, null, null); // waits indefinitely
      Thread me = Thread.currentThread();
      Thread interrupter = new Thread(() -> {
        try {
          Thread.sleep(500); // a few refused attempts and the pauses between them
        } catch (InterruptedException e) {
          return;
        }
        me.interrupt();
      });
      interrupter.start();
      Throwable t = thrown("acquire", g::acquire);
      assertTrue(Thread.interrupted()); // (cleared here, or join would raise it)
      interrupter.join();
      assertInstanceOf(AgentboxInterruptedException.class, t, String.valueOf(t));
    }
  }

  @Test
  void badInputIsAnInvalidRequestExceptionNotANullPointer() {
    List<Executable> bad = List.of(
        () -> ExecOptions.argv((String[]) null),
        () -> ExecOptions.argv("echo", null),
        () -> ExecOptions.shell(null),
        () -> ExecOptions.argv("cat").stdin((byte[]) null),
        () -> ExecOptions.argv("cat").stdin((String) null),
        () -> ExecOptions.argv("cat").stdin((java.io.InputStream) null),
        () -> new Scope(null, "a", null, null),
        () -> Sandboxes.using(null, "n"),
        () -> SandboxSpec.of(null),
        () -> SandboxSpec.fromTemplate(null),
        () -> new IsolationKey(null, null, null));
    for (Executable e : bad) {
      assertInstanceOf(InvalidRequestException.class, thrown("bad input", e));
    }
  }
}
