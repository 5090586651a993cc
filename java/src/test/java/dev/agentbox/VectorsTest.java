package dev.agentbox;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.DynamicTest.dynamicTest;

import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Instant;
import java.util.AbstractMap;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.stream.Stream;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;
import tools.jackson.databind.json.JsonMapper;

/**
 * Every vector the Rust code generates ({@code tests/vectors/protocol.json}) must come out the
 * same here: scope keys, labels, names, path rules, exec argv and status, session framing, file
 * scripts and the guard's rules.
 */
class VectorsTest {
  static final Map<String, Object> V = load();

  static Map<String, Object> load() {
    Path p = Path.of(System.getProperty("agentbox.vectors", "../tests/vectors/protocol.json"));
    return Kube.cast(JsonMapper.builder().build().readValue(p.toFile(), Map.class));
  }

  /** A display name that is never blank (JUnit refuses those). */
  static String name(Object o) {
    String s = String.valueOf(o);
    return "[" + s + "]";
  }

  static Map<String, Object> m(Object o, String k) {
    return Kube.cast(((Map<?, ?>) o).get(k));
  }

  static List<Map<String, Object>> list(Object o, String k) {
    return Kube.cast(((Map<?, ?>) o).get(k));
  }

  static int i(Object o, String k) {
    return ((Number) ((Map<?, ?>) o).get(k)).intValue();
  }

  static String s(Object o, String k) {
    Object v = ((Map<?, ?>) o).get(k);
    return v == null ? null : v.toString();
  }

  /**
   * Format 2 is the lossless exec frame's (exec.trailer, stdin modes); format 1 the vectors
   * before it, read only until the lossless frame reaches main (the exec tests below check all
   * of it they can: everything of remote_argv but the wrapper text and MARK and STDIN).
   */
  @Test
  void theVectorFileIsAFormatThisSuiteReads() {
    int f = i(V, "format");
    assertTrue(f == 2 || f == 1, "format " + f);
    assertEquals(f == 2, m(V, "exec").containsKey("trailer"));
  }

  @Test
  void labelAndAnnotationKeys() {
    Map<String, Object> l = m(V, "labels");
    assertEquals(Labels.SCOPE, s(l, "scope"));
    assertEquals(Labels.SCOPE_KEY, s(l, "scope_key"));
    assertEquals(Labels.AGENT, s(l, "agent"));
    assertEquals(Labels.USER, s(l, "user"));
    assertEquals(Labels.SESSION, s(l, "session"));
    assertEquals(Labels.SANDBOX, s(l, "sandbox"));
    assertEquals(Labels.MANAGED_BY, s(l, "managed_by"));
    assertEquals(Labels.MANAGER, s(l, "manager"));
    assertEquals(Labels.AGENT_ID, s(l, "agent_id"));
    assertEquals(Labels.USER_ID, s(l, "user_id"));
    assertEquals(Labels.SESSION_ID, s(l, "session_id"));
    assertEquals(Labels.SCOPE_KEY_LEN, i(l, "scope_key_len"));
    assertEquals(Labels.MAX_LABEL, i(l, "max_label"));
  }

  @TestFactory
  Stream<DynamicTest> scopeKeysLabelsAndNames() {
    return list(V, "scopes").stream().map(c -> dynamicTest(s(c, "sandbox_name"), () -> {
      Scope scope = Scope.fromMap(m(c, "scope"));
      assertEquals(m(c, "scope"), scope.toMap());
      String key = Labels.scopeKey(scope);
      assertEquals(s(c, "scope_key"), key);
      assertEquals(m(c, "labels"), Labels.scopeLabels(scope));
      assertEquals(m(c, "annotations"), Labels.scopeAnnotations(scope));
      assertEquals(s(c, "selector"), Labels.scopeSelector(scope));
      String name = Labels.sandboxNameForScope(scope);
      assertEquals(s(c, "sandbox_name"), name);
      assertEquals(s(c, "pod_name"), Labels.podName(name));
      assertEquals(s(c, "sandbox_label_value"), Labels.sandboxLabelValue(name));
      assertEquals(s(c, "lease_name"), Labels.leaseName(key));
      // the isolation key maps one to one to the same scope
      assertEquals(scope, IsolationKey.of(scope).toScope());
    }));
  }

  @TestFactory
  Stream<DynamicTest> labelValueValidity() {
    return list(V, "label_values").stream().map(c -> dynamicTest("'" + s(c, "value") + "'",
        () -> assertEquals(c.get("valid"), Labels.isValidLabelValue(s(c, "value")))));
  }

  @TestFactory
  Stream<DynamicTest> boundedNames() {
    return list(V, "bounded_names").stream().map(c -> dynamicTest(s(c, "name"),
        () -> assertEquals(s(c, "name"), Labels.boundedName(s(c, "base"), i(c, "max")))));
  }

  @TestFactory
  Stream<DynamicTest> pathConfinement() {
    return list(V, "confine").stream().map(c -> dynamicTest(s(c, "root") + "|" + s(c, "path"), () -> {
      if (c.containsKey("ok")) {
        assertEquals(s(c, "ok"), Files.confine(s(c, "root"), s(c, "path")));
      } else {
        PathException e = assertThrows(PathException.class, () -> Files.confine(s(c, "root"), s(c, "path")));
        assertEquals(s(c, "error"), e.reason());
      }
    }));
  }

  @Test
  void execConstants() {
    Map<String, Object> e = m(V, "exec");
    assertEquals(Wire.SANDBOX_CONTAINER, s(e, "container"));
    if (lossless()) {
      assertEquals(List.of(Wire.PROTOCOL), e.get("protocols"));
    } else {
      assertEquals(Wire.PROTOCOL, list(e, "protocols").get(0));
    }
    Map<String, Object> ch = m(e, "channels");
    assertEquals(List.of(Wire.STDIN_CHANNEL, Wire.STDOUT_CHANNEL, Wire.STDERR_CHANNEL,
        Wire.STATUS_CHANNEL, Wire.CLOSE_CHANNEL),
        List.of(i(ch, "stdin"), i(ch, "stdout"), i(ch, "stderr"), i(ch, "status"), i(ch, "close")));
    assertEquals(Wire.STDIN_FRAME, i(e, "stdin_frame"));
    assertEquals(Wire.DEFAULT_MAX_OUTPUT, i(e, "default_max_output"));
    assertEquals(Wire.TIMEOUT_GRACE_MS, i(e, "timeout_grace_ms"));
  }

  /** The vectors carry the lossless frame (wrapper with MARK and STDIN, trailer cases). */
  static boolean lossless() {
    return i(V, "format") >= 2;
  }

  /**
   * The wrapper of the vectors before the lossless frame (its first line): until those vectors
   * land, the tests below check everything of remote_argv but the wrapper text and the two new
   * parameters.
   */
  static final String OLD_WRAPPER_START = "t=$1; d=$2; n=$3; shift 3\n";

  @Test
  void theWrapperIsTheVectorsOne() {
    String w = s(m(V, "exec"), "wrapper");
    if (lossless()) {
      assertEquals(w, Wire.WRAPPER);
    } else {
      assertTrue(w.startsWith(OLD_WRAPPER_START), "vectors without the trailer cases must be the old frame");
      assertTrue(Wire.WRAPPER.startsWith("m=$1; i=$2; t=$3; d=$4; n=$5; shift 5\n"));
    }
  }

  /**
   * Killing an abandoned command is the shared protocol's: the environment entry every command
   * gets and the script of the second exec that kills by it are the vectors' (Rust's
   * remote::PROCESS_ENV and remote::PROCESSES), byte for byte.
   */
  @Test
  void theKillEntryAndScriptAreTheVectorsOnes() {
    Map<String, Object> e = m(V, "exec");
    assertEquals(s(e, "process_env"), Wire.PROCESS_ENV);
    assertEquals(s(e, "processes_script"), Wire.PROCESSES);
  }

  record Req(List<String> argv, Long timeoutMs, String workdir, List<Map.Entry<String, String>> env) {}

  static Req req(Map<String, Object> r) {
    List<String> argv = Kube.cast(r.get("argv"));
    List<List<String>> env = Kube.cast(r.get("env"));
    List<Map.Entry<String, String>> e = new ArrayList<>();
    for (List<String> kv : env) {
      e.add(new AbstractMap.SimpleImmutableEntry<>(kv.get(0), kv.get(1)));
    }
    Number t = (Number) r.get("timeout_ms");
    return new Req(argv, t == null ? null : t.longValue(), s(r, "workdir"), e);
  }

  @TestFactory
  Stream<DynamicTest> remoteArgv() {
    return list(m(V, "exec"), "remote_argv").stream().map(c -> dynamicTest(
        name(String.join(" ", req(m(c, "request")).argv())), () -> {
          Req r = req(m(c, "request"));
          if (c.containsKey("error")) {
            assertEquals("Invalid", s(c, "error"));
            assertThrows(InvalidRequestException.class,
                () -> Wire.remoteArgv("", "-", r.argv(), r.timeoutMs(), r.workdir(), r.env()));
            return;
          }
          List<String> want = Kube.cast(c.get("remote_argv"));
          if (lossless()) {
            assertEquals(want, Wire.remoteArgv(s(c, "mark"), stdinMode(m(c, "request").get("stdin")),
                r.argv(), r.timeoutMs(), r.workdir(), r.env()));
            return;
          }
          List<String> got = Wire.remoteArgv("M", "-", r.argv(), r.timeoutMs(), r.workdir(), r.env());
          assertEquals("M", got.get(4));
          assertEquals("-", got.get(5));
          List<String> rest = new ArrayList<>(got.subList(6, got.size()));
          if (want.size() > 3 && want.get(0).equals("sh") && want.get(2).startsWith(OLD_WRAPPER_START)) {
            // the old frame's parameters after the wrapper: TIMEOUT WORKDIR N ENV... ARGV...
            assertEquals(want.subList(4, want.size()), rest);
          } else {
            // the old frame ran a command without settings bare
            assertEquals(List.of("", "", "0"), rest.subList(0, 3));
            assertEquals(want, rest.subList(3, rest.size()));
          }
        }));
  }

  /** A request's {@code stdin} of the vectors (null, a length, or "stream") as the wrapper's. */
  static String stdinMode(Object stdin) {
    if ("stream".equals(stdin)) {
      return Wire.STDIN_STREAM;
    }
    return Wire.stdinMode(stdin == null ? null : ((Number) stdin).intValue());
  }

  @TestFactory
  Stream<DynamicTest> sleepArg() {
    return list(m(V, "exec"), "sleep_arg").stream().map(c -> dynamicTest(s(c, "ms"),
        () -> assertEquals(s(c, "arg"), Wire.sleepArg(i(c, "ms")))));
  }

  @TestFactory
  Stream<DynamicTest> exitStatusFromTheStatusChannel() {
    JsonMapper json = JsonMapper.builder().build();
    return list(m(V, "exec"), "status").stream().map(c -> dynamicTest(String.valueOf(c.get("outcome")), () -> {
      byte[] raw = json.writeValueAsBytes(c.get("status"));
      Map<String, Object> out = m(c, "outcome");
      if (out.containsKey("code")) {
        assertEquals(new Wire.ExitStatus(i(out, "code"), ""), Wire.parseStatus(raw));
      } else if (out.containsKey("unknown")) {
        assertEquals(new Wire.ExitStatus(null, s(out, "unknown")), Wire.parseStatus(raw));
      } else {
        CommandNotStartedException e = assertThrows(CommandNotStartedException.class, () -> Wire.parseStatus(raw));
        assertEquals(s(out, "not_started"), e.getMessage());
      }
    }));
  }

  @Test
  void aStatusThatIsNotJsonIsAProtocolError() {
    assertThrows(ProtocolException.class, () -> Wire.parseStatus("{nope".getBytes(StandardCharsets.UTF_8)));
  }

  @TestFactory
  Stream<DynamicTest> trailer() {
    if (!lossless()) {
      return Stream.of(dynamicTest("no trailer vectors before the lossless frame",
          () -> assertFalse(m(V, "exec").containsKey("trailer"))));
    }
    return list(m(V, "exec"), "trailer").stream().map(c -> dynamicTest(name(c.get("chunks")), () -> {
      Wire.TrailerFilter f = new Wire.TrailerFilter(s(c, "mark"));
      List<String> chunks = Kube.cast(c.get("chunks"));
      List<String> passed = new ArrayList<>();
      StringBuilder out = new StringBuilder();
      for (String ch : chunks) {
        String p = new String(f.push(ch.getBytes(StandardCharsets.UTF_8)), StandardCharsets.UTF_8);
        passed.add(p);
        out.append(p);
      }
      assertEquals(c.get("passed"), passed);
      assertEquals(s(c, "out"), out.toString());
      assertEquals(i(c, "received"), f.received());
      assertEquals(c.get("whole"), f.complete());
      assertEquals(c.get("memory"), f.memory());
    }));
  }

  @TestFactory
  Stream<DynamicTest> sessionEndTrailers() {
    return list(m(V, "session"), "end_trailers").stream().map(c -> dynamicTest(
        name(s(c, "trailer")), () -> {
          Wire.SessionEnd got = Wire.parseSessionEnd(s(c, "trailer"));
          if (c.containsKey("unparsable")) {
            assertNull(got);
          } else {
            assertEquals(new Wire.SessionEnd(i(c, "code"), (Boolean) c.get("memory")), got);
          }
        }));
  }

  @Test
  void outOfMemoryConstants() {
    Map<String, Object> o = m(V, "oom");
    assertEquals(s(o, "reason"), Oom.OOM_KILLED);
    assertEquals(s(o, "memory_flag"), Wire.MEMORY_FLAG);
    assertEquals(i(o, "clock_skew_ms"), Oom.CLOCK_SKEW.toMillis());
    assertEquals(i(o, "settle_ms"), Oom.SETTLE.toMillis());
    assertEquals(i(o, "poll_ms"), Oom.POLL.toMillis());
    Map<String, Object> mt = m(o, "memory_trailer");
    assertEquals(s(mt, "trailer"), Wire.memoryTrailer(s(mt, "mark")));
    List<String> files = Kube.cast(o.get("counter_files"));
    for (String f : files) {
      assertTrue(Wire.WRAPPER.contains(f) && Wire.SESSION_OOM.contains(f), f);
    }
  }

  @TestFactory
  Stream<DynamicTest> containerKilledForMemory() {
    return list(m(V, "oom"), "container").stream().map(c -> dynamicTest(
        name(String.valueOf(c.get("status"))), () -> {
          Map<String, Object> pod = Map.of("status", c.get("status"));
          assertEquals(c.get("killed"),
              Oom.killedSince(pod, Wire.SANDBOX_CONTAINER, Instant.parse(s(c, "since"))));
        }));
  }

  @TestFactory
  Stream<DynamicTest> sessionShellArgv() {
    return list(m(V, "session"), "shell_argv").stream().map(c -> dynamicTest(
        String.valueOf(c.get("workdir")),
        () -> assertEquals(c.get("argv"), Wire.sessionShellArgv((String) c.get("workdir")))));
  }

  @TestFactory
  Stream<DynamicTest> sessionCommandLine() {
    return list(m(V, "session"), "command_lines").stream().map(c -> dynamicTest(
        name(String.join(" ", req(m(c, "request")).argv())), () -> {
          Req r = req(m(c, "request"));
          if (c.containsKey("error")) {
            assertThrows(InvalidRequestException.class,
                () -> Wire.sessionArgv(r.argv(), r.timeoutMs(), r.workdir(), r.env()));
            return;
          }
          if (lossless()) {
            assertEquals(s(c, "line"), SessionFrames.commandLine(
                Wire.sessionArgv(r.argv(), r.timeoutMs(), r.workdir(), r.env()), s(c, "mark")));
            return;
          }
          // Before the lossless frame: the line of the old argv (quoting and framing).
          List<String> old = new ArrayList<>();
          for (Map<String, Object> a : list(m(V, "exec"), "remote_argv")) {
            if (m(a, "request").equals(m(c, "request"))) {
              old = Kube.cast(a.get("remote_argv"));
            }
          }
          assertFalse(old.isEmpty(), "the same request is among exec.remote_argv");
          assertEquals(s(c, "line"), SessionFrames.commandLine(old, s(c, "mark")));
        }));
  }

  @TestFactory
  Stream<DynamicTest> sessionFraming() {
    return list(m(V, "session"), "framing").stream().map(c -> dynamicTest(String.valueOf(c.get("chunks")), () -> {
      SessionFrames.Framer f = new SessionFrames.Framer(s(c, "start"), s(c, "end"), i(c, "cap"));
      Map<String, Object> got = Map.of("incomplete", true);
      List<String> chunks = Kube.cast(c.get("chunks"));
      for (int n = 0; n < chunks.size(); n++) {
        SessionFrames.Done done;
        try {
          done = f.feed(chunks.get(n).getBytes(StandardCharsets.UTF_8));
        } catch (SessionException e) {
          got = Map.of("error", "Session", "after_chunk", n);
          break;
        }
        if (done != null) {
          got = Map.of("trailer", done.trailer(), "rest", new String(done.rest(), StandardCharsets.UTF_8),
              "after_chunk", n);
          break;
        }
      }
      Map<String, Object> want = new LinkedHashMap<>(m(c, "outcome"));
      want.replaceAll((k, v) -> v instanceof Number num ? (Object) num.intValue() : v);
      assertEquals(want, got);
      assertEquals(s(c, "out"), new String(f.out().bytes(), StandardCharsets.UTF_8));
      assertEquals(c.get("truncated"), f.out().truncated());
    }));
  }

  @Test
  void fileScriptsAreTheRustOnes() {
    Map<String, Object> f = m(V, "files");
    assertEquals(Files.ARGV0, s(f, "argv0"));
    assertEquals(Files.PROLOGUE, s(f, "prologue"));
    assertEquals(Map.of("read", Files.READ, "write", Files.WRITE, "list", Files.LIST,
        "upload", Files.UPLOAD, "download", Files.DOWNLOAD), m(f, "scripts"));
    assertEquals(Files.ESCAPES, i(f, "exit_escapes"));
    assertEquals(Files.MISSING, i(f, "exit_missing"));
    assertEquals(Files.SPOOL_FAILED, i(f, "exit_spool_failed"));
    assertEquals(Files.TOO_LARGE, i(f, "exit_too_large"));
    assertTrue(Files.UPLOAD.contains("${" + s(f, "limit_env") + ":-}"));
    assertEquals(Files.READ_CAP, i(f, "read_cap"));
  }

  @Test
  void aFailedUploadSpoolIsItsOwnException() {
    byte[] err = "cat: write error: No space left on device\n".getBytes(StandardCharsets.UTF_8);
    UploadSpoolException e = assertThrows(UploadSpoolException.class, () -> Files.check("/workspace/src",
        new ExecResult(Files.SPOOL_FAILED, new byte[0], err, false, false, false, "")));
    assertEquals(Files.SPOOL_FAILED, e.exitCode());
    assertTrue(e instanceof RemoteException);
    assertTrue(e.getMessage().contains("disk full") && e.getMessage().contains("No space left on device"),
        e.getMessage());
    RemoteException other = assertThrows(RemoteException.class, () -> Files.check("/workspace/src",
        new ExecResult(1, new byte[0], err, false, false, false, "")));
    assertFalse(other instanceof UploadSpoolException);
  }

  @Test
  void anUploadPastTheSizeLimitIsItsOwnException() {
    byte[] err = "agentbox: the upload would pass the workspace's size limit of 67108864 bytes\n"
        .getBytes(StandardCharsets.UTF_8);
    UploadTooLargeException e = assertThrows(UploadTooLargeException.class, () -> Files.check("/workspace/src",
        new ExecResult(Files.TOO_LARGE, new byte[0], err, false, false, false, "")));
    assertEquals(Files.TOO_LARGE, e.exitCode());
    assertTrue(e instanceof RemoteException);
    assertTrue(e.getMessage().contains("size limit of 67108864 bytes"), e.getMessage());
    assertEquals("UploadTooLarge", ErrorKind.of(e).orElseThrow().kindName());
  }

  static String script(String name) {
    return switch (name) {
      case "read" -> Files.READ;
      case "write" -> Files.WRITE;
      case "list" -> Files.LIST;
      case "upload" -> Files.UPLOAD;
      case "download" -> Files.DOWNLOAD;
      default -> throw new AssertionError(name);
    };
  }

  @TestFactory
  Stream<DynamicTest> fileRequestArgv() {
    return list(m(V, "files"), "requests").stream().map(c -> dynamicTest(s(c, "script") + ":" + s(c, "path"), () -> {
      if (c.containsKey("error")) {
        PathException e = assertThrows(PathException.class,
            () -> Files.fileArgv(script(s(c, "script")), s(c, "root"), s(c, "path")));
        assertEquals(s(c, "error"), e.reason());
      } else {
        Files.Request r = Files.fileArgv(script(s(c, "script")), s(c, "root"), s(c, "path"));
        assertEquals(c.get("argv"), r.argv());
        assertEquals(s(c, "confined"), r.confined());
      }
    }));
  }

  @TestFactory
  Stream<DynamicTest> listingRecords() {
    return list(m(V, "files"), "listings").stream().map(c -> dynamicTest(name(s(c, "raw")), () -> {
      byte[] raw = s(c, "raw").getBytes(StandardCharsets.UTF_8);
      if (Boolean.TRUE.equals(c.get("error"))) {
        assertThrows(ProtocolException.class, () -> Files.parseListing(raw));
        return;
      }
      List<Map<String, Object>> got = new ArrayList<>();
      for (Files.DirEntry e : Files.parseListing(raw)) {
        String kind = e.kind().name().charAt(0) + e.kind().name().substring(1).toLowerCase(java.util.Locale.ROOT);
        got.add(Map.of("name", e.name(), "kind", kind, "size", (int) e.size(), "mode", e.mode(), "mtime", (int) e.mtime()));
      }
      List<Map<String, Object>> want = new ArrayList<>();
      for (Map<String, Object> e : list(c, "entries")) {
        Map<String, Object> w = new LinkedHashMap<>(e);
        w.replaceAll((k, v) -> v instanceof Number num ? (Object) num.intValue() : v);
        want.add(w);
      }
      assertEquals(want, got);
    }));
  }

  @Test
  void guardDefaults() {
    Map<String, Object> d = m(m(V, "guard"), "defaults");
    GuardConfig cfg = GuardConfig.defaults();
    assertEquals(i(d, "lease_duration_ms"), cfg.leaseDurationMs());
    assertEquals(i(d, "retry_interval_ms"), cfg.retryIntervalMs());
    assertEquals(i(d, "clock_skew_ms"), cfg.clockSkewMs());
  }

  static Map<String, String> strings(Object o, String k) {
    Map<String, Object> m = m(o, k);
    if (m == null) {
      return null;
    }
    Map<String, String> out = new LinkedHashMap<>();
    m.forEach((key, v) -> out.put(key, v.toString()));
    return out;
  }

  static long msOr0(Object o, String k) {
    Object v = ((Map<?, ?>) o).get(k);
    return v == null ? 0 : ((Number) v).longValue();
  }

  @TestFactory
  Stream<DynamicTest> guardVerdicts() {
    return list(m(V, "guard"), "judge").stream().map(c -> dynamicTest(s(c, "me") + "/" + s(c, "now") + "/" + s(c, "unchanged_for_ms"), () -> {
      Guard.Verdict v = Guard.judge(m(c, "spec"), strings(c, "annotations"), s(c, "me"), Guard.parseTime(s(c, "now")),
          i(c, "unchanged_for_ms"), msOr0(c, "slot_unchanged_for_ms"), i(c, "clock_skew_ms"), i(c, "default_duration_ms"));
      assertEquals(s(c, "verdict"), v.label());
      if (!c.containsKey("me")) {
        Guard.Verdict old = Guard.judge(m(c, "spec"), Guard.parseTime(s(c, "now")), i(c, "unchanged_for_ms"),
            i(c, "clock_skew_ms"), i(c, "default_duration_ms"));
        assertEquals(s(c, "verdict"), old.label());
      }
    }));
  }

  @Test
  void guardAnnotationNames() {
    Map<String, Object> n = m(m(V, "guard"), "annotation_names");
    assertEquals(s(n, "next"), Guard.NEXT_ANNOTATION);
    assertEquals(s(n, "next_renew"), Guard.NEXT_RENEW_ANNOTATION);
    assertEquals(s(n, "fair_holder"), Guard.FAIR_HOLDER_ANNOTATION);
    assertEquals(i(m(m(V, "guard"), "defaults"), "watch_fallback_ms"), Guard.WATCH_FALLBACK_MS);
    assertEquals(i(m(m(V, "guard"), "defaults"), "yield_ms"), Guard.YIELD_MS);
  }

  @TestFactory
  Stream<DynamicTest> guardAnnotationWrites() {
    return list(m(V, "guard"), "annotations").stream().map(c -> dynamicTest(s(c, "op"), () -> {
      Map<String, String> before = strings(c, "before");
      String me = s(c, "me");
      Map<String, String> got = switch (s(c, "op")) {
        case "take" -> Guard.takenAnnotations(before, me);
        case "claim" -> Guard.claimedAnnotations(before, me, Guard.parseTime(s(c, "now")));
        default -> Guard.withdrawnAnnotations(before, me);
      };
      assertEquals(strings(c, "after"), got);
    }));
  }

  @TestFactory
  Stream<DynamicTest> guardSharedHold() {
    return list(m(V, "guard"), "shared_hold").stream().map(c -> dynamicTest("shared", () -> {
      boolean got = Guard.sharedHold((Boolean) c.get("queue"), (Boolean) c.get("waited"), strings(c, "before"),
          s(c, "me"));
      assertEquals(c.get("shared"), got, c.toString());
    }));
  }

  @TestFactory
  Stream<DynamicTest> guardYield() {
    return list(m(V, "guard"), "yield").stream().map(c -> dynamicTest("yield", () -> {
      long got = Guard.yieldFor(strings(c, "annotations"), s(c, "me"), i(c, "yield_left_ms"));
      assertEquals(i(c, "yield_ms"), got, c.toString());
    }));
  }

  @TestFactory
  Stream<DynamicTest> guardReleasedSpec() {
    return list(m(V, "guard"), "released_spec").stream().map(c -> dynamicTest("released", () -> {
      Map<String, Object> want = new LinkedHashMap<>(m(c, "after"));
      assertEquals(want, Guard.releasedSpec(m(c, "before")));
    }));
  }

  @TestFactory
  Stream<DynamicTest> guardTakenSpec() {
    return list(m(V, "guard"), "taken_spec").stream().map(c -> dynamicTest(s(c, "lease_duration_ms"), () -> {
      GuardConfig cfg = GuardConfig.withLeaseDuration(i(c, "lease_duration_ms")).withHolder(s(c, "holder"));
      Map<String, Object> want = new LinkedHashMap<>(m(c, "spec"));
      want.replaceAll((k, v) -> v instanceof Number num ? (Object) num.intValue() : v);
      assertEquals(want, Guard.takenSpec(m(c, "old"), cfg, Guard.parseTime(s(c, "now"))));
    }));
  }

  @TestFactory
  Stream<DynamicTest> guardTimings() {
    return list(m(V, "guard"), "timings").stream().map(c -> dynamicTest(s(c, "lease_duration_ms"), () -> {
      GuardConfig cfg = GuardConfig.withLeaseDuration(i(c, "lease_duration_ms"));
      assertEquals(i(c, "duration_secs"), cfg.durationSecs());
      assertEquals(i(c, "renew_every_ms"), cfg.renewEveryMs());
      assertEquals(i(c, "trust_window_ms"), cfg.trustWindowMs());
    }));
  }

  @Test
  void microTimeRoundTrips() {
    Instant t = Instant.parse("2027-01-15T08:00:30.123456Z");
    assertEquals("2027-01-15T08:00:30.123456Z", Guard.microTime(t));
    assertEquals(t, Guard.parseTime("2027-01-15T08:00:30.123456Z"));
    assertEquals(t, Guard.parseTime("2027-01-15T09:00:30.1234567+01:00"));
  }

  /**
   * Every error kind the vectors name for Java has its own {@link ErrorKind} (generated from the
   * same Rust table) with that exception class, which extends its parent kind's class; a kind
   * Java never throws has none. No kind falls back to a vaguer exception.
   */
  @TestFactory
  Stream<DynamicTest> errorKinds() {
    List<Map<String, Object>> kinds = list(V, "error_kinds");
    long named = kinds.stream().filter(k -> k.get("java") != null).count();
    assertEquals(named, ErrorKind.values().length, "ErrorKind is stale: run `cargo run --bin clientgen`");
    return kinds.stream().map(k -> dynamicTest(s(k, "kind"), () -> {
      ErrorKind found = null;
      for (ErrorKind e : ErrorKind.values()) {
        if (e.kindName().equals(s(k, "kind"))) {
          found = e;
        }
      }
      if (s(k, "java") == null) {
        assertNull(found, s(k, "kind") + " is not thrown by Java but has an ErrorKind");
        return;
      }
      assertTrue(found != null, s(k, "kind") + " has no ErrorKind: run `cargo run --bin clientgen`");
      Class<? extends AgentboxException> c = found.exceptionClass();
      assertEquals("dev.agentbox." + s(k, "java"), c.getName());
      Class<?> parent = s(k, "parent") == null
          ? AgentboxException.class
          : found.parent().orElseThrow().exceptionClass();
      assertEquals(s(k, "parent"), found.parent().map(ErrorKind::kindName).orElse(null));
      assertTrue(parent.isAssignableFrom(c) && parent != c, c + " extends " + parent);
    }));
  }

  @Test
  void errorKindOfNamesTheMostSpecificKind() {
    assertEquals(ErrorKind.FILE_NOT_FOUND, ErrorKind.of(new RemoteFileNotFoundException("x")).orElseThrow());
    assertEquals(ErrorKind.NOT_FOUND, ErrorKind.of(new NotFoundException("x")).orElseThrow());
    assertEquals(ErrorKind.INVALID_SPEC, ErrorKind.of(Kube.mapStatus(
        new io.fabric8.kubernetes.client.KubernetesClientException("bad", 422, null), "sandbox s")).orElseThrow());
    assertEquals(ErrorKind.GUARD_LOST, ErrorKind.of(new GuardLostException("lease")).orElseThrow());
    assertEquals(ErrorKind.OUTPUT_CUT, ErrorKind.of(new OutputCutException("stdout", 3)).orElseThrow());
    assertFalse(ErrorKind.of(new ClientClosedException("closed")).isPresent());
    assertFalse(ErrorKind.of(new IllegalStateException("not ours")).isPresent());
  }
}
