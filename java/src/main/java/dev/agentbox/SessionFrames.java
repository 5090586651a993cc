package dev.agentbox;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.List;
import java.util.stream.Collectors;

/**
 * The persistent session's framing (the Rust crate's {@code agentbox_api::exec::session}, checked
 * against its vectors): each command is one line that runs it in a subshell with stdin from
 * {@code /dev/null}, framed by sentinels carrying a fresh mark — a start sentinel on stdout,
 * the output, then an end sentinel with {@code $?} on stdout and one on stderr.
 */
public final class SessionFrames {
  private SessionFrames() {}

  /** Longest trailer accepted after an end sentinel. */
  public static final int MAX_TRAILER = 32;

  /** Single-quotes {@code s} for {@code sh}. */
  public static String shQuote(String s) {
    return "'" + s.replace("'", "'\\''") + "'";
  }

  /** The line written to the shell for one command. */
  public static String commandLine(List<String> argv, String mark) {
    String cmd = argv.stream().map(SessionFrames::shQuote).collect(Collectors.joining(" "));
    // The end sentinel carries $?, and "!" after it when the command died of SIGKILL with the
    // container's OOM kill counter risen meanwhile.
    String oom = Wire.SESSION_OOM;
    return "printf '%s+\\n' '" + mark + "'; " + oom + " _ab_o=$_ab_k; ( exec " + cmd + " ) </dev/null; "
        + "_ab_r=$?; _ab_m=; if [ $_ab_r = 137 ] && [ -n \"$_ab_o\" ]; then " + oom
        + " [ -n \"$_ab_k\" ] && [ \"$_ab_k\" -gt \"$_ab_o\" ] 2>/dev/null && _ab_m='" + Wire.MEMORY_FLAG
        + "'; fi; printf '%s%d%s\\n' '" + mark + "' \"$_ab_r\" \"$_ab_m\"; printf '%s\\n' '" + mark
        + "' >&2\n";
  }

  /** A complete frame: the trailer and the bytes after it. */
  public record Done(String trailer, byte[] rest) {}

  /**
   * Incremental parser of one command's frame on one stream: skips to the start sentinel (if
   * any), collects output (capped) up to the end sentinel, then takes the text up to the next
   * newline as the trailer. Memory stays bounded by the cap plus a sentinel's length.
   */
  public static final class Framer {
    private byte[] start;
    private final byte[] end;
    private byte[] buf = new byte[0];
    private final Wire.Capped out;

    public Framer(String start, String end, int cap) {
      this.start = start == null ? null : start.getBytes(StandardCharsets.UTF_8);
      this.end = end.getBytes(StandardCharsets.UTF_8);
      this.out = new Wire.Capped(cap);
    }

    public boolean awaitingStart() {
      return start != null;
    }

    public Wire.Capped out() {
      return out;
    }

    /** Feeds bytes; returns the trailer and the rest once the frame is complete, else null. */
    public Done feed(byte[] data) {
      byte[] b = new byte[buf.length + data.length];
      System.arraycopy(buf, 0, b, 0, buf.length);
      System.arraycopy(data, 0, b, buf.length, data.length);
      buf = b;
      if (start != null) {
        int p = find(buf, start);
        if (p < 0) {
          // Stray output of earlier commands' background jobs: drop it, keeping a possible
          // sentinel prefix.
          int keep = Math.min(start.length - 1, buf.length);
          buf = Arrays.copyOfRange(buf, buf.length - keep, buf.length);
          return null;
        }
        buf = Arrays.copyOfRange(buf, p + start.length, buf.length);
        start = null;
      }
      int p = find(buf, end);
      if (p < 0) {
        int keep = Math.min(end.length - 1, buf.length);
        int n = buf.length - keep;
        out.push(buf, 0, n);
        buf = Arrays.copyOfRange(buf, n, buf.length);
        return null;
      }
      out.push(buf, 0, p);
      byte[] after = Arrays.copyOfRange(buf, p + end.length, buf.length);
      int nl = -1;
      for (int i = 0; i < after.length; i++) {
        if (after[i] == '\n') {
          nl = i;
          break;
        }
      }
      if (nl < 0) {
        if (after.length > MAX_TRAILER) {
          throw new SessionException("malformed frame trailer from the shell");
        }
        buf = Arrays.copyOfRange(buf, p, buf.length);
        return null;
      }
      String trailer = new String(after, 0, nl, StandardCharsets.UTF_8);
      byte[] rest = Arrays.copyOfRange(after, nl + 1, after.length);
      buf = new byte[0];
      return new Done(trailer, rest);
    }

    private static int find(byte[] hay, byte[] needle) {
      if (needle.length == 0 || hay.length < needle.length) {
        return -1;
      }
      outer:
      for (int i = 0; i + needle.length <= hay.length; i++) {
        for (int j = 0; j < needle.length; j++) {
          if (hay[i + j] != needle[j]) {
            continue outer;
          }
        }
        return i;
      }
      return -1;
    }
  }
}
