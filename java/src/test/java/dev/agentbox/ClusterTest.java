package dev.agentbox;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import io.fabric8.kubernetes.api.model.GenericKubernetesResource;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;
import org.junit.jupiter.api.Timeout;

/**
 * The Java client on the real cluster (hack/test's Java lane; {@code mvn -Pcluster test}):
 * create, exec, files, the guard between two threads and against the Rust CLI, snapshot and
 * restore, suspend and resume, a pod deleted under a running client, and bad input; commands
 * that end when told (an interrupt, a failing sink, a timeout, a session closed) with nothing
 * of them left in the pod, output over the cap flagged, and a delete's timeout of its own kind.
 */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
@Timeout(value = 6, unit = TimeUnit.MINUTES)
class ClusterTest {
  ClusterEnv env;
  SandboxHandle ready;

  @BeforeAll
  void setUp() {
    env = new ClusterEnv("client");
    ready = env.ready(Scope.forSession("java-tests", env.ns));
  }

  @AfterAll
  void tearDown() {
    if (env != null) {
      env.close();
    }
  }

  static byte[] b(String s) {
    return s.getBytes(StandardCharsets.UTF_8);
  }

  @Test
  void theSandboxOfAScopeIsTheOneEveryClientNames() {
    Scope scope = ready.scope();
    assertEquals(Labels.sandboxNameForScope(scope), ready.name());
    GenericKubernetesResource o = env.sandboxes.kube().get(Kube.SANDBOXES, env.ns, ready.name());
    assertEquals(Labels.scopeLabels(scope), o.getMetadata().getLabels());
    assertEquals(Labels.scopeAnnotations(scope), o.getMetadata().getAnnotations());
    // get-or-create again (as a second harness would) gets the same object
    SandboxHandle again = env.sandboxes.getOrCreate(scope, SandboxSpec.image(ClusterEnv.BASE_IMAGE));
    assertEquals(o.getMetadata().getUid(), again.resource().getMetadata().getUid());
    assertEquals("Ready", again.resource().getStatus().get("phase"));
  }

  @Test
  void theReadmesJavaRuns() {
    assertEquals("ship it\n", ReadmeExample.turn(env.ns));
  }

  @Test
  void execGivesTheRealExitCodeOutputStdinEnvAndWorkdir() {
    ExecResult r = ready.exec("echo out; echo err >&2; exit 3");
    assertEquals(3, r.exitCode());
    assertEquals("out\n", r.stdoutText());
    assertEquals("err\n", r.stderrText());
    assertThrows(CommandException.class, () -> ready.exec(ExecOptions.shell("exit 5").check()));
    assertEquals("/workspace\n", ready.exec("pwd").stdoutText());
    ExecResult e = ready.exec(ExecOptions.argv("sh", "-c", "cd /tmp && pwd; printf %s \"$X\"")
        .env("X", "it's \"q\" $HOME").workdir("/"));
    assertEquals("/tmp\nit's \"q\" $HOME", e.stdoutText());
    assertEquals("3:abc", ready.exec(ExecOptions.shell("c=$(cat); echo -n ${#c}:$c").stdin("abc")).stdoutText());
    assertEquals(127, ready.exec(ExecOptions.argv("agentbox-no-such-command")).exitCode());
    assertEquals(126, ready.exec(ExecOptions.argv("true").workdir("/no/such/dir")).exitCode());
  }

  @Test
  void largeOutputAndStdinArriveWhole() {
    // 3 MiB each way: every byte, in order (the trailer says the stream is whole)
    byte[] data = new byte[3 << 20];
    new java.util.Random(7).nextBytes(data);
    ExecResult r = ready.exec(ExecOptions.argv("cat").stdin(data));
    assertEquals(0, r.exitCode());
    assertArrayEquals(data, r.stdout());
    ExecResult big = ready.exec("head -c 5000000 /dev/zero");
    assertEquals(5_000_000, big.stdout().length);
    ExecResult capped = ready.exec(ExecOptions.shell("head -c 100000 /dev/zero").maxOutput(1000));
    assertEquals(1000, capped.stdout().length);
    assertTrue(capped.stdoutTruncated());
    // a stream of unknown length, read to its end
    ExecResult s = ready.exec(ExecOptions.argv("wc", "-c").stdin(new java.io.ByteArrayInputStream(data)));
    assertEquals(Integer.toString(data.length), s.stdoutText().strip());
  }

  @Test
  void aTimeoutKillsTheCommandsProcessGroup() {
    ExecTimeoutException e = assertThrows(ExecTimeoutException.class, () -> ready.exec(
        ExecOptions.shell("(sleep 60; echo late > /workspace/late) & echo started; sleep 60").timeout(Duration.ofMillis(1500))));
    assertNotNull(e.result());
    assertEquals(137, e.result().exitCode());
    assertEquals("started\n", e.result().stdoutText());
    // the background child was in the group: it is gone too
    assertEquals("", ready.exec("ps -o pid,args | grep '[s]leep 60' || true").stdoutText());
  }

  /** 200 MiB of zeros into tail, which holds them as one line: far past a 64 MiB limit. */
  static final String HOG = "head -c 209715200 /dev/zero | tail";

  /**
   * A command its sandbox's memory limit kills is an {@link OutOfMemoryException} (one-shot exec
   * and session), not exit code 137, and the sandbox carries on. (Under gVisor the whole
   * container: the test below.)
   */
  @Test
  void aCommandKilledForMemoryIsOutOfMemory() {
    SandboxHandle sbx = env.sandboxes.getOrCreate(Scope.forUser("java-oom", "runc"),
        SandboxSpec.image(ClusterEnv.BASE_IMAGE).imagePullPolicy("Never").set("resources",
            Map.of("limits", Map.of("memory", "64Mi"), "requests", Map.of("memory", "64Mi"))))
        .waitReady(180_000);
    ExecOptions hog = ExecOptions.shell(HOG).timeout(Duration.ofSeconds(60));
    OutOfMemoryException e = assertThrows(OutOfMemoryException.class, () -> sbx.exec(hog));
    assertFalse(e.container(), e.getMessage());
    try (Session s = sbx.session()) {
      OutOfMemoryException se = assertThrows(OutOfMemoryException.class, () -> s.run(hog));
      assertFalse(se.container(), se.getMessage());
      assertEquals("still\n", s.run("echo still").stdoutText());
    }
    assertEquals("alive\n", sbx.exec("echo alive").stdoutText());
  }

  /**
   * Under gVisor a command over the limit takes the whole sandbox with it (the kernel kills
   * gVisor's runtime, which holds every process): an {@link OutOfMemoryException} of the
   * container, from the kubelet's OOMKilled (docs/security.md, "Memory under gVisor"), one-shot
   * exec and session.
   */
  @Test
  void underGVisorACommandKilledForMemoryIsOutOfMemoryOfTheContainer() throws Exception {
    SandboxHandle sbx = env.sandboxes.getOrCreate(Scope.forUser("java-oom", "gvisor"),
        SandboxSpec.image(ClusterEnv.BASE_IMAGE).imagePullPolicy("Never")
            .set("runtimeClassName", "gvisor").set("resources",
                Map.of("limits", Map.of("memory", "64Mi"), "requests", Map.of("memory", "64Mi"))))
        .waitReady(180_000);
    ExecOptions hog = ExecOptions.shell(HOG).timeout(Duration.ofSeconds(60));
    OutOfMemoryException e = assertThrows(OutOfMemoryException.class, () -> sbx.exec(hog));
    assertTrue(e.container(), e.getMessage());
    back(sbx);
    try (Session s = sbx.session()) {
      OutOfMemoryException se = assertThrows(OutOfMemoryException.class, () -> s.run(hog));
      assertTrue(se.container(), se.getMessage());
    }
    back(sbx);
  }

  /** Until the sandbox answers again (the kubelet restarts a container killed for memory). */
  static void back(SandboxHandle sbx) throws InterruptedException {
    for (int i = 0; i < 120; i++) {
      try {
        if ("back\n".equals(sbx.exec("echo back").stdoutText())) {
          return;
        }
      } catch (AgentboxException e) {
        // not yet
      }
      Thread.sleep(1000);
    }
    fail("the sandbox did not come back after its container was killed");
  }

  @Test
  void aSessionKeepsOneShell() {
    try (Session s = ready.session()) {
      assertEquals("a\n", s.run("echo a").stdoutText());
      ExecResult r = s.run(ExecOptions.shell("echo $V; exit 4").env("V", "v"));
      assertEquals(4, r.exitCode());
      assertEquals("v\n", r.stdoutText());
      assertThrows(ExecTimeoutException.class, () -> s.run(ExecOptions.shell("sleep 30").timeout(Duration.ofMillis(500))));
      assertEquals("after\n", s.run("echo after").stdoutText());
      assertEquals(ready.workspaceRoot() + "\n", s.run("pwd").stdoutText());
    }
    // A session in a directory that does not exist fails its command, naming it.
    try (Session lost = ready.session("/no/such/dir")) {
      SessionException e = assertThrows(SessionException.class, () -> lost.run("true"));
      assertTrue(e.getMessage().contains("/no/such/dir"), e.getMessage());
    }
  }

  @Test
  void filesAreConfinedToTheWorkspace() {
    ready.write("dir/a b.txt", b("hello\n"));
    assertEquals("hello\n", new String(ready.read("dir/a b.txt"), StandardCharsets.UTF_8));
    ready.write("/workspace/dir/x.sh", b("#!/bin/sh\necho x\n"), 0755);
    Files.DirEntry st = ready.stat("dir/x.sh");
    assertEquals(0755, st.mode());
    assertEquals(Files.Kind.FILE, st.kind());
    List<Files.DirEntry> ls = ready.ls("dir");
    assertEquals(List.of("a b.txt", "x.sh"), ls.stream().map(Files.DirEntry::name).toList());
    assertTrue(ready.exists("dir"));
    ready.mkdir("d1/d2", true);
    assertEquals(Files.Kind.DIR, ready.stat("d1/d2").kind());
    ready.rm("d1", true);
    assertFalse(ready.exists("d1"));
    assertThrows(RemoteFileNotFoundException.class, () -> ready.read("no-such-file"));
    // bad input: refused here, before any request
    PathException dotdot = assertThrows(PathException.class, () -> ready.read("../etc/passwd"));
    assertEquals("DotDot", dotdot.reason());
    assertEquals("OutsideRoot", assertThrows(PathException.class, () -> ready.write("/etc/x", b("x"))).reason());
    // and in the pod: a symlink leading out
    ready.exec("ln -sfn /etc /workspace/out");
    assertEquals("Escapes", assertThrows(PathException.class, () -> ready.read("out/passwd")).reason());
    // (the shared scripts refuse to rm a path that resolves outside, as they refuse to read it)
    assertEquals("Escapes", assertThrows(PathException.class, () -> ready.rm("out", false)).reason());
    ready.exec(ExecOptions.argv("rm", "/workspace/out").check());
  }

  @Test
  void aDirectoryGoesOutAndBackInAsATarStream() {
    ready.write("tree/a.txt", b("a"));
    ready.write("tree/sub/b.bin", new byte[300_000]);
    java.io.ByteArrayOutputStream tar = new java.io.ByteArrayOutputStream();
    ready.downloadTar("tree", tar);
    assertTrue(tar.size() > 300_000, "a tar of the tree: " + tar.size());
    ready.uploadTar("copy", new java.io.ByteArrayInputStream(tar.toByteArray()));
    assertEquals(0, ready.exec("diff -r /workspace/tree /workspace/copy").exitCode());
    // Through a spool in the state directory, removed once extracted.
    assertEquals("", ready.exec("ls -A /workspace/.agentbox/tmp").stdoutText());
    assertThrows(RemoteFileNotFoundException.class, () -> ready.downloadTar("no-such-dir", new java.io.ByteArrayOutputStream()));
    ready.rm("copy", true);
  }

  /**
   * A tar upload that would pass the workspace's size limit is an {@link UploadTooLargeException}
   * before anything is extracted, naming the limit (measured on this default node root; the check
   * is the upload's own either way: tests/quota.rs has the hard limit), with no spool left; an
   * upload that fits goes through afterwards. The archives come from the unlimited sandbox.
   */
  @Test
  void anUploadThatWouldPassTheSizeLimitFailsWhole() {
    // 8 MiB, not 64: this client's upload of a ~40 MiB array took over six minutes in a loaded
    // CI run; the check is the same at any size.
    SandboxHandle sbx = env.sandboxes.getOrCreate(Scope.forSession("java-tests", env.ns + "-limit"),
        SandboxSpec.image(ClusterEnv.BASE_IMAGE).imagePullPolicy("Never")
            .set("workspace", Map.of("sizeLimit", "8Mi")))
        .waitReady(180_000);
    String left = "echo $(ls -A /workspace/dst)/$(ls -A /workspace/.agentbox/tmp | grep upload-)";
    // ~5 MiB: its spool fits the 8 MiB, the spool and its files do not.
    byte[] five = tarOf(5);
    UploadTooLargeException e = assertThrows(UploadTooLargeException.class,
        () -> sbx.uploadTar("dst", new java.io.ByteArrayInputStream(five)));
    assertTrue(e.getMessage().contains("size limit of 8388608 bytes"), e.getMessage());
    assertEquals("/\n", sbx.exec(left).stdoutText());
    sbx.uploadTar("dst", new java.io.ByteArrayInputStream(tarOf(1)));
    assertEquals(1 << 20, Integer.parseInt(sbx.exec("wc -c < /workspace/dst/sub/blob").stdoutText().trim()));
    assertEquals("first.txt sub/\n", sbx.exec(left).stdoutText());
  }

  /** A tar of a tree with {@code mib} MiB in {@code sub/blob}, made in the unlimited sandbox. */
  byte[] tarOf(int mib) {
    ready.exec(ExecOptions.shell("rm -rf /workspace/lim && mkdir -p /workspace/lim/sub && echo first > "
        + "/workspace/lim/first.txt && head -c " + (mib << 20) + " /dev/zero > /workspace/lim/sub/blob").check());
    java.io.ByteArrayOutputStream tar = new java.io.ByteArrayOutputStream();
    ready.downloadTar("lim", tar);
    ready.rm("lim", true);
    return tar.toByteArray();
  }

  @Test
  void twoThreadsExcludeEachOtherOnOneScopeWithMonotonicFencingTokens() throws Exception {
    ExecutorService pool = Executors.newFixedThreadPool(2);
    try (Guard first = ready.guard(30_000L).acquire()) {
      Future<Object> second = pool.submit(() -> {
        try (Guard g = ready.guard(500L)) {
          g.acquire();
          return "acquired";
        } catch (GuardTimeoutException e) {
          return e;
        }
      });
      Object got = second.get();
      assertTrue(got instanceof GuardTimeoutException, String.valueOf(got));
      assertEquals(first.holder(), ((GuardTimeoutException) got).holder());
      CountDownLatch waiting = new CountDownLatch(1);
      Future<Integer> third = pool.submit(() -> {
        waiting.countDown();
        try (Guard g = ready.guard(60_000L).acquire()) {
          return g.fencingToken();
        }
      });
      waiting.await();
      int token = first.fencingToken();
      first.release(); // released: the waiting thread gets it
      first.release(); // idempotent
      assertTrue(third.get() > token);
    } finally {
      pool.shutdownNow();
    }
  }

  @Test
  void aJavaHolderKeepsTheRustCliOutAndTheCliKeepsJavaOut() throws Exception {
    try (Guard g = ready.guard(30_000L).acquire()) {
      Object[] r = env.cli("lock", ready.name(), "--wait", "1", "--", "true");
      assertEquals(1, r[0], (String) r[1]);
      assertTrue(((String) r[1]).contains("timed out waiting for lease") && ((String) r[1]).contains(g.holder()), (String) r[1]);
    }
    java.nio.file.Path dir = java.nio.file.Files.createTempDirectory("agentbox-java-");
    java.nio.file.Path token = dir.resolve("token");
    Process cli = new ProcessBuilder(ClusterEnv.binary("agentbox", "AGENTBOX_CLI_BIN").toString(), "-n", env.ns,
        "lock", ready.name(), "--", "sh", "-c", "echo \"$AGENTBOX_FENCING_TOKEN\" > " + token + "; sleep 5")
        .redirectErrorStream(true).redirectOutput(dir.resolve("out").toFile()).start();
    try {
      while (!java.nio.file.Files.exists(token) || java.nio.file.Files.readString(token).isBlank()) {
        assertTrue(cli.isAlive() || java.nio.file.Files.exists(token), "the CLI ended before it held the lease");
        Thread.sleep(100);
      }
      int rust = Integer.parseInt(java.nio.file.Files.readString(token).strip());
      GuardTimeoutException e = assertThrows(GuardTimeoutException.class, () -> ready.guard(500L).acquire());
      assertFalse(e.holder().isEmpty());
      try (Guard g = ready.guard(60_000L).acquire()) {
        assertEquals(0, cli.waitFor());
        assertTrue(g.fencingToken() > rust);
      }
    } finally {
      cli.destroy();
      cli.waitFor();
      ClusterEnv.deleteTree(dir.toFile());
    }
  }

  @Test
  void losingTheLeaseInterruptsTheGuardedWork() throws Exception {
    Guard g = ready.guard(30_000L, GuardConfig.withLeaseDuration(3_000));
    GenericKubernetesResource[] taken = new GenericKubernetesResource[1];
    GuardLostException e = assertThrows(GuardLostException.class, () -> g.run(() -> {
      // someone takes the lease over behind our back (a conditioned write; read again when a
      // renewal of ours came between its read and its write, as CI once saw under load)
      Kube k = env.sandboxes.kube();
      for (int attempt = 0; taken[0] == null; attempt++) {
        GenericKubernetesResource l = k.get(Kube.LEASES, env.ns, g.leaseName());
        Map<String, Object> spec = Kube.cast(l.getAdditionalProperties().get("spec"));
        spec.put("holderIdentity", "thief");
        try {
          taken[0] = k.update(Kube.LEASES, env.ns, l);
        } catch (ConflictException c) {
          assertTrue(attempt < 20, "the thief's write conflicted 20 times");
        }
      }
      Thread.sleep(60_000); // interrupted at the next renewal
      return null;
    }));
    assertNotNull(e);
    assertTrue(g.isLost());
    g.close(); // never throws, even lost
    // free it again for the other tests
    Kube k = env.sandboxes.kube();
    GenericKubernetesResource l = k.get(Kube.LEASES, env.ns, g.leaseName());
    Map<String, Object> spec = Kube.cast(l.getAdditionalProperties().get("spec"));
    assertEquals("thief", spec.get("holderIdentity"));
    spec.remove("holderIdentity");
    k.update(Kube.LEASES, env.ns, l);
  }

  @Test
  void snapshotRestoreAndTheHarnessState() {
    SandboxHandle s = env.ready(Scope.forUser("java-tests", "snap@example.com"));
    s.write("keep.txt", b("v1"));
    SandboxState state = env.sandboxes.persistWorkspace(s.state(), 300_000);
    assertNotNull(state.lastSnapshot());
    Snapshot snap = env.sandboxes.getSnapshot(state.lastSnapshot());
    assertTrue(snap.ready());
    assertEquals(Labels.scopeKey(s.scope()), snap.scopeKey());
    assertEquals(List.of(snap.name()), s.snapshots().stream().map(Snapshot::name).toList());
    s.write("keep.txt", b("v2"));
    SandboxHandle back = env.sandboxes.hydrateWorkspace(state, SandboxSpec.image(ClusterEnv.BASE_IMAGE).imagePullPolicy("Never"), 300_000);
    assertEquals("v1", new String(back.read("keep.txt"), StandardCharsets.UTF_8));
    assertEquals(s.name(), back.name());
    assertThrows(NotFoundException.class, () -> back.restore("no-such-snapshot", 10_000));
  }

  @Test
  void suspendIsReportedAndResumeBringsTheWorkspaceBack() {
    SandboxHandle s = env.ready(Scope.forAgent("java-suspend"));
    s.write("kept", b("yes"));
    s.suspend();
    assertThrows(SandboxSuspendedException.class, () -> s.waitReady(60_000));
    s.resume();
    s.waitReady(180_000);
    SandboxHandle served = s.recover(180_000);
    assertEquals("yes", new String(served.read("kept"), StandardCharsets.UTF_8));
    s.delete(true, 120_000);
    assertThrows(NotFoundException.class, () -> env.sandboxes.open(s.name()));
  }

  @Test
  void aPodDeletedUnderARunningClientFailsTheCommandNotTheData() throws Exception {
    SandboxHandle s = env.ready(Scope.forAgent("java-pod-loss"));
    s.write("kept", b("still here"));
    CompletableFuture<ExecResult> running = CompletableFuture.supplyAsync(
        () -> s.exec("echo started; sleep 120; echo never"));
    // the command is running once its pod shows it
    while (!s.exec("ps -o args | grep -q '[s]leep 120' && echo y || true").stdoutText().contains("y")) {
      Thread.sleep(100);
    }
    // Not a force deletion (grace 0): the kubelet confirms the old containers are gone before
    // the pod object goes and the operator starts the next pod under the same name.
    env.client.pods().inNamespace(env.ns).withName(s.podName()).withGracePeriod(1).delete();
    try {
      ExecResult r = running.get(150, TimeUnit.SECONDS);
      fail("a command whose pod was deleted returned a result: " + r.exitCode() + " " + r.stdoutText());
    } catch (java.util.concurrent.ExecutionException e) {
      assertTrue(e.getCause() instanceof ExecException || e.getCause() instanceof TransportException,
          String.valueOf(e.getCause()));
      System.err.println("the command of the deleted pod: " + e.getCause());
    }
    SandboxHandle back = s.recover(180_000);
    assertEquals("still here", new String(back.read("kept"), StandardCharsets.UTF_8));
  }

  @Test
  void badInputGetsClearErrors() {
    assertThrows(InvalidRequestException.class, () -> Scope.forSession("a", ""));
    assertThrows(InvalidRequestException.class, () -> ready.exec(ExecOptions.argv("true").env("1BAD", "x")));
    // a missing image: never Ready, with the kubelet's reason
    SandboxHandle s = env.sandboxes.getOrCreate(Scope.forAgent("java-missing-image"),
        SandboxSpec.image("docker.io/library/agentbox-no-such-image:0").imagePullPolicy("Never"));
    // generous: the wait ends as soon as the kubelet reports the image; a loaded CI machine once
    // took over 30 s to get that far (the pod still PodStarting)
    SandboxNotReadyException e = assertThrows(SandboxNotReadyException.class, () -> s.waitReady(180_000));
    assertTrue(e.getMessage().contains("agentbox-no-such-image") || e.reason().contains("Image"), e.getMessage());
    System.err.println("a missing image: " + e.getMessage());
    s.delete(true, 120_000);
    // a template that does not exist: refused before anything is created
    assertThrows(NotFoundException.class,
        () -> env.sandboxes.getOrCreate(Scope.forAgent("java-no-template"), SandboxSpec.fromTemplate("no-such-template")));
    assertThrows(NotFoundException.class, () -> env.sandboxes.open("no-such-sandbox"));
  }

  // ---- processes end when told, nothing cut short in silence, failures of their own kind ----

  /**
   * The lines of {@code ps} in the ready sandbox whose command starts with {@code pattern} (an
   * extended regex): the commands themselves, not the shells or the grep that name them.
   */
  String running(String pattern) {
    return ready.exec("ps -o pid,args | grep -E '^ *[0-9]+ +(" + pattern + ")' || true").stdoutText();
  }

  /** Waits (bounded) until {@code n} processes match: the command under test has started. */
  void awaitRunning(String pattern, int n) throws InterruptedException {
    for (int i = 0; i < 600; i++) {
      if (running(pattern).lines().count() >= n) {
        return;
      }
      Thread.sleep(100);
    }
    fail("never running: " + pattern + "\n" + running("."));
  }

  /** Runs {@code body} on a thread of its own; the handle gives what it raised. */
  static final class Bg {
    final java.util.concurrent.atomic.AtomicReference<Throwable> thrown = new java.util.concurrent.atomic.AtomicReference<>();
    volatile boolean returned;
    final Thread thread;

    Bg(org.junit.jupiter.api.function.Executable body) {
      thread = new Thread(() -> {
        try {
          body.execute();
          returned = true;
          thrown.set(new AssertionError("returned without an exception"));
        } catch (Throwable t) {
          thrown.set(t);
        }
      });
      thread.setDaemon(true);
      thread.start();
    }

    Throwable await() throws InterruptedException {
      thread.join(120_000);
      assertFalse(thread.isAlive(), "still blocked after 120 s");
      return thrown.get();
    }
  }

  @Test
  void anInterruptedExecKillsTheCommandAndEverythingItStarted() throws Exception {
    String p = "sleep 100[456]";
    Bg bg = new Bg(() -> ready.exec("sleep 1004 & setsid sleep 1005 & sleep 1006"));
    awaitRunning(p, 3);
    bg.thread.interrupt(); // Future.cancel(true), an executor's shutdownNow, a lost guard
    Throwable t = bg.await();
    assertTrue(t instanceof AgentboxInterruptedException, String.valueOf(t));
    // killed before the exception reached the caller: nothing to wait for
    assertEquals("", running(p));
  }

  @Test
  void aTimeoutAlsoKillsWhatLeftTheCommandsProcessGroup() {
    // Out of the group, and not holding the exec's output open (which would keep the exit
    // status from coming: then the client gives up after the grace, and kills them as well).
    ExecTimeoutException e = assertThrows(ExecTimeoutException.class, () -> ready.exec(
        ExecOptions.shell("setsid sleep 1041 >/dev/null 2>&1 & (setsid sleep 1042 >/dev/null 2>&1 &); sleep 1043")
            .timeout(Duration.ofMillis(1500))));
    assertNotNull(e.result(), "the exit status arrived");
    assertEquals(137, e.result().exitCode());
    assertEquals("", running("sleep 104[123]"));
  }

  @Test
  void aCommandWhoseOutputSinkFailsIsKilledWithItsChildren() {
    java.io.OutputStream failing = new java.io.OutputStream() {
      long n;

      @Override
      public void write(int b) throws java.io.IOException {
        write(new byte[] {(byte) b}, 0, 1);
      }

      @Override
      public void write(byte[] b, int off, int len) throws java.io.IOException {
        n += len;
        if (n > (1 << 20)) {
          throw new java.io.IOException("disk full (test)");
        }
      }
    };
    ExecException e = assertThrows(ExecException.class,
        () -> ready.exec(ExecOptions.shell("sleep 1031 & yes").stdoutTo(failing)));
    assertTrue(e.getMessage().contains("disk full (test)"), e.getMessage());
    assertEquals("", running("sleep 1031|yes$"));
  }

  @Test
  void closingASessionKillsWhatItStartedAndTheCommandRunningInIt() throws Exception {
    String p = "sleep 101[12]";
    Session s = ready.session();
    assertEquals(0, s.run("sleep 1011 >/dev/null 2>&1 &").exitCode()); // a server left running
    Bg cmd = new Bg(() -> s.run("sleep 1012"));
    awaitRunning(p, 2);
    Bg closer = new Bg(s::close); // from another thread, while the command runs
    closer.await();
    assertTrue(closer.returned, "close() raised " + closer.thrown.get());
    Throwable t = cmd.await();
    assertTrue(t instanceof ClientClosedException, String.valueOf(t));
    assertEquals("", running(p));
    assertThrows(ClientClosedException.class, () -> s.run("true"));
  }

  @Test
  void anInterruptedSessionCommandIsKilledAndTheSessionGoesOn() throws Exception {
    try (Session s = ready.session()) {
      assertEquals("a\n", s.run("echo a").stdoutText());
      Bg cmd = new Bg(() -> s.run("sleep 1021 & sleep 1022"));
      awaitRunning("sleep 102[12]", 2);
      cmd.thread.interrupt();
      Throwable t = cmd.await();
      assertTrue(t instanceof AgentboxInterruptedException, String.valueOf(t));
      assertEquals("", running("sleep 102[12]"));
      assertEquals("b\n", s.run("echo b").stdoutText()); // a new shell
    }
  }

  @Test
  void outputOverTheCapIsFlaggedAndTheCapCanBeRaised() {
    String nine = "head -c 9437184 /dev/zero"; // 9 MiB against the 8 MiB default
    ExecResult capped = ready.exec(nine);
    assertEquals(0, capped.exitCode());
    assertEquals(Wire.DEFAULT_MAX_OUTPUT, capped.stdout().length);
    assertTrue(capped.stdoutTruncated() && capped.truncated(), "the cut is flagged");
    ExecResult whole = ready.exec(ExecOptions.shell(nine).maxOutput(16 << 20));
    assertEquals(9 << 20, whole.stdout().length);
    assertFalse(whole.truncated());
    ExecResult err = ready.exec(ExecOptions.shell(nine + " >&2").maxOutput(1 << 20));
    assertTrue(err.stderrTruncated() && !err.stdoutTruncated());
    try (Session s = ready.session()) {
      ExecResult sc = s.run(nine);
      assertEquals(Wire.DEFAULT_MAX_OUTPUT, sc.stdout().length);
      assertTrue(sc.stdoutTruncated());
      ExecResult sw = s.run(ExecOptions.shell(nine).maxOutput(16 << 20));
      assertEquals(9 << 20, sw.stdout().length);
      assertFalse(sw.truncated());
    }
  }

  @Test
  void aStdinStreamThatFailsIsAnErrorNotAShortInput() {
    java.io.InputStream failing = new java.io.InputStream() {
      int left = 1000;

      @Override
      public int read() throws java.io.IOException {
        byte[] b = new byte[1];
        return read(b, 0, 1) < 0 ? -1 : b[0] & 0xff;
      }

      @Override
      public int read(byte[] b, int off, int len) throws java.io.IOException {
        if (left == 0) {
          throw new java.io.IOException("source lost (test)");
        }
        int n = Math.min(len, left);
        left -= n;
        return n;
      }
    };
    ExecException e = assertThrows(ExecException.class,
        () -> ready.exec(ExecOptions.argv("wc", "-c").stdin(failing)));
    assertTrue(e.getMessage().contains("after 1000 bytes") && e.getMessage().contains("source lost (test)"),
        e.getMessage());
  }

  @Test
  void aDeleteThatDoesNotFinishInTimeIsSandboxNotDeleted() throws Exception {
    SandboxHandle s = env.sandboxes.getOrCreate(Scope.forAgent("java-delete-timeout"),
        SandboxSpec.image(ClusterEnv.BASE_IMAGE).imagePullPolicy("Never"));
    String hold = "test.agentbox.dev/hold";
    holdFinalizer(s.name(), hold, true);
    try {
      SandboxNotDeletedException e = assertThrows(SandboxNotDeletedException.class, () -> s.delete(true, 3_000));
      assertEquals(s.name(), e.name());
    } finally {
      holdFinalizer(s.name(), hold, false);
    }
    s.delete(true, 120_000);
    assertThrows(NotFoundException.class, () -> env.sandboxes.open(s.name()));
  }

  /** Adds or removes a finalizer of a Sandbox (again on a conflict with the operator's writes). */
  void holdFinalizer(String name, String finalizer, boolean add) throws InterruptedException {
    var res = env.client.genericKubernetesResources(Kube.SANDBOXES).inNamespace(env.ns).withName(name);
    for (int attempt = 1; ; attempt++) {
      try {
        res.edit(o -> {
          List<String> f = o.getMetadata().getFinalizers() == null ? new java.util.ArrayList<>()
              : new java.util.ArrayList<>(o.getMetadata().getFinalizers());
          if (add) {
            f.add(finalizer);
          } else {
            f.remove(finalizer);
          }
          o.getMetadata().setFinalizers(f);
          return o;
        });
        return;
      } catch (io.fabric8.kubernetes.client.KubernetesClientException e) {
        if (e.getCode() != 409 || attempt == 20) {
          throw e;
        }
        Thread.sleep(50);
      }
    }
  }

}
