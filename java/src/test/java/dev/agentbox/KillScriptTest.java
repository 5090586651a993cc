package dev.agentbox;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/**
 * {@link Wire#PROCESSES} run here with the machine's {@code sh}, on processes started as the
 * pod starts a command (the wrapper's argv, with {@link Wire#PROCESS_ENV}): it kills the command, a
 * child in the background, one in a process group and session of its own, one reparented
 * (double fork), and leaves a process of another run alone. The scan reads this machine's
 * /proc: only processes carrying the test's own random run id match.
 */
class KillScriptTest {
  /** Pids whose environment holds {@code AGENTBOX_PROCESS=id}, read as the script reads them. */
  static List<Long> carrying(String id) throws Exception {
    List<Long> found = new ArrayList<>();
    byte[] want = (Wire.PROCESS_ENV + "=" + id).getBytes(StandardCharsets.UTF_8);
    try (var dirs = java.nio.file.Files.newDirectoryStream(Path.of("/proc"), "[0-9]*")) {
      for (Path d : dirs) {
        byte[] env;
        try {
          env = java.nio.file.Files.readAllBytes(d.resolve("environ"));
        } catch (java.io.IOException e) {
          continue; // gone, or not ours to read
        }
        int start = 0;
        for (int i = 0; i <= env.length; i++) {
          if (i == env.length || env[i] == 0) {
            if (java.util.Arrays.equals(env, start, i, want, 0, want.length)) {
              found.add(Long.parseLong(d.getFileName().toString()));
            }
            start = i + 1;
          }
        }
      }
    }
    return found;
  }

  static Process started(String id, Long timeoutMs, String script) throws Exception {
    List<String> argv = Wire.remoteArgv(Wire.newMark(), Wire.STDIN_NONE, List.of("sh", "-c", script),
        timeoutMs, null, List.of(Map.entry(Wire.PROCESS_ENV, id)));
    return new ProcessBuilder(argv).redirectErrorStream(true)
        .redirectOutput(ProcessBuilder.Redirect.DISCARD).start();
  }

  static int kill(String id) throws Exception {
    Process k = new ProcessBuilder("sh", "-c", Wire.PROCESSES, "sh", "kill", id)
        .redirectErrorStream(true).start();
    assertTrue(k.waitFor(120, TimeUnit.SECONDS), "the kill script ended");
    return k.exitValue();
  }

  @Test
  void theKillScriptEndsEveryProcessOfARunAndNoOther() throws Exception {
    String id = Wire.newProcessId();
    String other = Wire.newProcessId();
    // background child, own session and group, double-forked orphan, the command itself
    String tree = "sleep 1001 & setsid sleep 1002 & (sleep 1003 &); sleep 1004";
    List<Process> ps = List.of(started(id, null, tree), started(id, 600_000L, tree));
    Process bystander = started(other, null, "sleep 1005");
    try {
      long until = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
      while (carrying(id).size() < 8 && System.nanoTime() < until) {
        Thread.sleep(50);
      }
      // per tree: 4 sleeps, and the watchdog's sleep under the timeout
      assertTrue(carrying(id).size() >= 8, "started: " + carrying(id));
      List<Long> others = carrying(other);
      assertFalse(others.isEmpty());

      assertEquals(0, kill(id));
      assertEquals(List.of(), carrying(id), "left after the kill script");
      for (Process p : ps) {
        p.getOutputStream().close(); // the wrapper's linger ends with stdin, as the client's close
        assertTrue(p.waitFor(60, TimeUnit.SECONDS), "the wrapper ended");
      }
      assertEquals(others, carrying(other), "another run's processes were left alone");
    } finally {
      kill(other);
      for (Process p : ps) {
        p.destroyForcibly();
      }
      bystander.destroyForcibly();
    }
    assertEquals(List.of(), carrying(other));
  }
}
