package dev.agentbox;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

/**
 * The wrapper's behaviour, run here with the machine's {@code sh} as the pod runs it (the same
 * argv, stdin fed as the client feeds the exec's): the trailer on both streams after the
 * command, the linger until stdin is closed, exact stdin lengths, the exit codes (126, 127, a
 * killed group's 137), and the trailer filter that reads the output back.
 */
class WrapperTest {
  record Run(byte[] out, byte[] err, int code, boolean aliveAfterTrailers) {}

  /** Reads one stream fully on a thread of its own. */
  static final class Drain extends Thread {
    final InputStream in;
    final ByteArrayOutputStream buf = new ByteArrayOutputStream();
    final String mark;
    volatile boolean sawMark;
    final Object seen = new Object();

    Drain(InputStream in, String mark) {
      this.in = in;
      this.mark = mark;
      setDaemon(true);
    }

    @Override
    public void run() {
      byte[] b = new byte[8192];
      try {
        int n;
        while ((n = in.read(b)) >= 0) {
          synchronized (seen) {
            buf.write(b, 0, n);
            if (!mark.isEmpty() && buf.toString(StandardCharsets.ISO_8859_1).endsWith(mark)) {
              sawMark = true;
              seen.notifyAll();
            }
          }
        }
      } catch (IOException e) {
        // the process ended
      }
    }

    void awaitMark() throws InterruptedException {
      synchronized (seen) {
        while (!sawMark) {
          seen.wait();
        }
      }
    }
  }

  static Run run(String mark, String mode, byte[] stdin, Long timeoutMs, String workdir,
      Map<String, String> env, String... argv) throws Exception {
    List<Map.Entry<String, String>> e = new ArrayList<>(env.entrySet());
    List<String> cmd = Wire.remoteArgv(mark, mode, List.of(argv), timeoutMs, workdir, e);
    Process p = new ProcessBuilder(cmd).start();
    Drain out = new Drain(p.getInputStream(), mark);
    Drain err = new Drain(p.getErrorStream(), mark);
    out.start();
    err.start();
    OutputStream in = p.getOutputStream();
    if (stdin != null) {
      in.write(stdin);
      in.flush();
    }
    boolean alive = false;
    if (!mark.isEmpty() && !mode.equals(Wire.STDIN_STREAM)) {
      out.awaitMark();
      err.awaitMark();
      // Both trailers are out: the wrapper must still be there, lingering on stdin.
      alive = p.isAlive();
    }
    in.close();
    int code = p.waitFor();
    out.join();
    err.join();
    return new Run(out.buf.toByteArray(), err.buf.toByteArray(), code, alive);
  }

  static byte[] b(String s) {
    return s.getBytes(StandardCharsets.UTF_8);
  }

  static String filtered(String mark, byte[] raw) {
    Wire.TrailerFilter f = new Wire.TrailerFilter(mark);
    byte[] passed = f.push(raw);
    assertTrue(f.complete(), "the stream ends with its trailer");
    return new String(passed, StandardCharsets.UTF_8);
  }

  @Test
  void theCommandsOutputThenTheTrailerOnBothStreamsAndItLingersUntilStdinCloses() throws Exception {
    String mark = Wire.newMark();
    Run r = run(mark, "-", null, null, null, Map.of(), "sh", "-c", "echo out; echo err >&2; exit 3");
    assertTrue(r.aliveAfterTrailers());
    assertEquals(3, r.code());
    assertEquals("out\n", filtered(mark, r.out()));
    assertEquals("err\n", filtered(mark, r.err()));
  }

  @Test
  void stdinOfKnownLengthIsReadExactlyAndTheRestIsLeftForTheLinger() throws Exception {
    String mark = Wire.newMark();
    Run r = run(mark, "5", b("hello world"), null, null, Map.of(), "cat");
    assertTrue(r.aliveAfterTrailers());
    assertEquals(0, r.code());
    assertEquals("hello", filtered(mark, r.out()));
  }

  @Test
  void aStreamedStdinIsReadToItsEndWithoutLinger() throws Exception {
    String mark = Wire.newMark();
    Run r = run(mark, "=", b("streamed\nbytes"), null, null, Map.of(), "cat");
    assertEquals(0, r.code());
    assertEquals("streamed\nbytes", filtered(mark, r.out()));
  }

  @Test
  void theCommandReadsNothingWithoutStdin() throws Exception {
    String mark = Wire.newMark();
    Run r = run(mark, "-", null, null, null, Map.of(), "sh", "-c", "cat; echo done");
    assertEquals("done\n", filtered(mark, r.out()));
  }

  @Test
  void workdirAndEnvironment() throws Exception {
    String mark = Wire.newMark();
    Run r = run(mark, "-", null, null, "/", Map.of("A_1", "x y 'q' $HOME"), "sh", "-c", "pwd; printf %s \"$A_1\"");
    assertEquals(0, r.code());
    assertEquals("/\nx y 'q' $HOME", filtered(mark, r.out()));
  }

  @Test
  void aWorkdirThatCannotBeEnteredIs126AndAMissingCommand127() throws Exception {
    String mark = Wire.newMark();
    Run r = run(mark, "-", null, null, "/nonexistent-agentbox-dir", Map.of(), "true");
    assertEquals(126, r.code());
    filtered(mark, r.out());
    Run m = run(mark, "-", null, null, null, Map.of(), "agentbox-no-such-command");
    assertEquals(127, m.code());
    assertTrue(filtered(mark, m.err()).contains("agentbox-no-such-command"));
  }

  @Test
  void theTimeoutKillsTheWholeProcessGroupAndTheTrailerStillComes() throws Exception {
    String mark = Wire.newMark();
    // a child that would print after the timeout: killed with its group, it never does
    Run r = run(mark, "-", null, 200L, null, Map.of(), "sh", "-c", "(sleep 30; echo late) & sleep 30; echo never");
    assertEquals(137, r.code());
    assertEquals("", filtered(mark, r.out()));
  }

  @Test
  void withATimeoutStdinStillReachesTheCommand() throws Exception {
    String mark = Wire.newMark();
    Run r = run(mark, "3", b("abcdef"), 60_000L, null, Map.of(), "cat");
    assertEquals(0, r.code());
    assertEquals("abc", filtered(mark, r.out()));
  }

  @Test
  void anEmptyMarkMeansNoTrailerAndNoLinger() throws Exception {
    Run r = run("", "-", null, 5_000L, null, Map.of(), "sh", "-c", "echo x; exit 4");
    assertEquals(4, r.code());
    assertEquals("x\n", new String(r.out(), StandardCharsets.UTF_8));
    assertEquals(0, r.err().length);
  }

  @Test
  void theFilterHoldsBackOnlyWhatMayStartTheMark() {
    String mark = "__AGENTBOX_0123456789abcdef0123456789abcdef_";
    Wire.TrailerFilter f = new Wire.TrailerFilter(mark);
    assertEquals("abc", new String(f.push(b("abc__AGENT")), StandardCharsets.UTF_8));
    assertFalse(f.complete());
    // not the mark after all: the held bytes go on
    assertEquals("__AGENTxyz", new String(f.push(b("xyz")), StandardCharsets.UTF_8));
    assertArrayEquals(new byte[0], f.push(b("__AGENTBOX_0123456789abcdef")));
    assertEquals("", new String(f.push(b("0123456789abcdef_")), StandardCharsets.UTF_8));
    assertTrue(f.complete());
    assertEquals(mark, new String(f.held(), StandardCharsets.UTF_8));
  }

  @Test
  void outputEndingWithoutTheMarkIsNotComplete() {
    Wire.TrailerFilter f = new Wire.TrailerFilter("__AGENTBOX_0123456789abcdef0123456789abcdef_");
    f.push(b("partial output __AGENTBOX_01"));
    assertFalse(f.complete());
    assertEquals(28, f.received());
  }

  @Test
  void aMarkIsFreshAndOfTheProtocolsShape() {
    String a = Wire.newMark();
    assertTrue(a.matches("__AGENTBOX_[0-9a-f]{32}_"), a);
    assertFalse(a.equals(Wire.newMark()));
  }
}
