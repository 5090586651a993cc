package dev.agentbox;

import java.nio.charset.StandardCharsets;
import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import tools.jackson.databind.JsonNode;
import tools.jackson.databind.json.JsonMapper;

/**
 * The pure parts of exec (docs/protocol.md, "Exec"), checked against the vectors: the channels,
 * the {@code sh} wrapper every one-shot command runs under (trailer mark, linger, workdir,
 * environment, a timeout that kills the command's process group), the exit status read from
 * the status channel, and the trailer filter that holds a mark back from the caller.
 */
public final class Wire {
  private Wire() {}

  /** The container of every sandbox pod. */
  public static final String SANDBOX_CONTAINER = "sandbox";
  /**
   * The one subprotocol offered: v5 can half-close stdin, which the wrapper's linger needs
   * (fabric8's own ExecWatch speaks only v4, so this client opens the WebSocket itself).
   */
  public static final String PROTOCOL = "v5.channel.k8s.io";

  public static final int STDIN_CHANNEL = 0;
  public static final int STDOUT_CHANNEL = 1;
  public static final int STDERR_CHANNEL = 2;
  public static final int STATUS_CHANNEL = 3;
  /** v5: {@code [CLOSE_CHANNEL, n]} half-closes channel n. */
  public static final int CLOSE_CHANNEL = 255;
  /** Largest stdin frame: one WebSocket message per 256 KiB. */
  public static final int STDIN_FRAME = 256 << 10;
  /** Default cap on each of stdout and stderr. */
  public static final int DEFAULT_MAX_OUTPUT = 8 << 20;
  /** How long to wait for the exit status after the timeout fired (a wedged connection). */
  public static final long TIMEOUT_GRACE_MS = 15_000;
  /** argv[0] of the wrapper ({@code $0} in its messages). */
  public static final String ARGV0 = "agentbox-exec";
  /** The trailer's prefix; 32 lowercase hex digits and {@code _} follow. */
  public static final String MARK_PREFIX = "__AGENTBOX_";

  /**
   * {@code STDIN}: the command reads nothing (also for zero bytes: it reads EOF either way); the
   * exec's stdin stays open for the linger.
   */
  public static final String STDIN_NONE = "-";
  /** {@code STDIN}: the command reads the exec's stdin until the client half-closes it. */
  public static final String STDIN_STREAM = "=";

  /**
   * The wrapper: {@code sh -c WRAPPER agentbox-exec MARK STDIN TIMEOUT WORKDIR N ENV...
   * ARGV...} (docs/protocol.md, "The wrapper"; the Rust crate's {@code exec::WRAPPER}, checked
   * against the vectors' {@code exec.wrapper}). Runs the command (in its own process group
   * under a watchdog when there is a timeout), prints the mark on stdout and stderr after it,
   * then lingers reading stdin until the client half-closes it, and exits with its code. When
   * the command died of SIGKILL and its container's OOM kill counter rose meanwhile, it prints
   * the memory trailer ({@link #memoryTrailer}) instead of the mark.
   */
  public static final String WRAPPER = Scripts.WRAPPER;

  /**
   * The environment entry every command this client runs gets, {@code AGENTBOX_PROCESS=<id>}
   * with one fresh id per one-shot exec and per session shell ({@link #newProcessId()}); every
   * process the command starts inherits it (unless it clears its environment). It is how
   * {@link #PROCESSES} finds what an abandoned command left: the command, its children, what it
   * put in the background or in a process group of its own, even once reparented. The shared
   * protocol's entry (vectors: {@code exec.process_env}, Rust {@code remote::PROCESS_ENV}).
   */
  public static final String PROCESS_ENV = "AGENTBOX_PROCESS";

  /**
   * {@code sh -c PROCESSES sh kill ID}: SIGKILLs every process of the container whose initial
   * environment holds {@code AGENTBOX_PROCESS=ID}, in rounds until a round finds none (a process
   * forked during a round is found by the next; more than 50 rounds is exit code 1, and it says
   * so; a zombie has no environment left). {@code list} instead of {@code kill} prints
   * {@code <pid> <ppid>} of each. The shared protocol's script, byte for byte (vectors:
   * {@code exec.processes_script}, Rust {@code remote::PROCESSES}). This client runs it when it
   * gives a command up (its thread interrupted, its output sink failing, its connection lost, no
   * exit status after the timeout) and when a session closes.
   */
  public static final String PROCESSES = Scripts.PROCESSES;

  /** A fresh {@link #PROCESS_ENV} value: 32 lowercase hex digits. */
  public static String newProcessId() {
    byte[] b = new byte[16];
    RANDOM.nextBytes(b);
    return HexFormat.of().formatHex(b);
  }

  private static final SecureRandom RANDOM = new SecureRandom();
  private static final JsonMapper JSON = JsonMapper.builder().build();

  /** A fresh trailer mark: {@code __AGENTBOX_} + 32 lowercase hex digits + {@code _}. */
  public static String newMark() {
    byte[] b = new byte[16];
    RANDOM.nextBytes(b);
    return MARK_PREFIX + HexFormat.of().formatHex(b) + "_";
  }

  /** Whether {@code name} is a portable environment variable name. */
  public static boolean isEnvName(String name) {
    if (name == null || name.isEmpty()) {
      return false;
    }
    char c0 = name.charAt(0);
    if (!(isAsciiLetter(c0) || c0 == '_')) {
      return false;
    }
    for (int i = 1; i < name.length(); i++) {
      char c = name.charAt(i);
      if (!(isAsciiLetter(c) || (c >= '0' && c <= '9') || c == '_')) {
        return false;
      }
    }
    return true;
  }

  private static boolean isAsciiLetter(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  }

  /** {@code sleep} argument for a timeout: seconds with millisecond precision, at least 1 ms. */
  public static String sleepArg(long ms) {
    long m = Math.max(ms, 1);
    return String.format(java.util.Locale.ROOT, "%d.%03d", m / 1000, m % 1000);
  }

  /** Refuses a bad request before anything is sent. */
  public static void validate(List<String> argv, Long timeoutMs, List<Map.Entry<String, String>> env) {
    if (argv == null || argv.isEmpty()) {
      throw new InvalidRequestException("invalid exec request: empty argv");
    }
    if (timeoutMs != null && timeoutMs < 0) {
      throw new InvalidRequestException("timeout must not be negative, not " + timeoutMs + " ms");
    }
    for (Map.Entry<String, String> e : env) {
      if (!isEnvName(e.getKey())) {
        throw new InvalidRequestException(
            "invalid exec request: invalid environment variable name '" + e.getKey() + "'");
      }
    }
  }

  /** The wrapper's {@code STDIN} for stdin of a known length ({@code null}: none). */
  public static String stdinMode(Integer knownLength) {
    return knownLength == null || knownLength == 0 ? STDIN_NONE : Integer.toString(knownLength);
  }

  /**
   * The argv sent to the container: {@code sh -c WRAPPER agentbox-exec MARK STDIN TIMEOUT
   * WORKDIR N ENV... ARGV...}.
   *
   * @param mark the trailer ({@link #newMark()}), or empty inside a persistent session
   * @param stdin {@link #STDIN_NONE}, {@link #STDIN_STREAM} or a decimal byte count
   */
  public static List<String> remoteArgv(
      String mark,
      String stdin,
      List<String> argv,
      Long timeoutMs,
      String workdir,
      List<Map.Entry<String, String>> env) {
    validate(argv, timeoutMs, env);
    List<String> out = new ArrayList<>(argv.size() + env.size() + 9);
    out.add("sh");
    out.add("-c");
    out.add(WRAPPER);
    out.add(ARGV0);
    out.add(mark);
    out.add(stdin);
    out.add(timeoutMs == null ? "" : sleepArg(timeoutMs));
    out.add(workdir == null ? "" : workdir);
    out.add(Integer.toString(env.size()));
    for (Map.Entry<String, String> e : env) {
      out.add(e.getKey() + "=" + e.getValue());
    }
    out.addAll(argv);
    return out;
  }

  /**
   * What a persistent session's shell starts with when the session has a directory ({@code $1}):
   * the shell runs there, so a command without a workdir of its own needs no wrapper (no extra
   * {@code sh} per command). A directory it cannot enter ends it at once (sh says why on stderr).
   */
  public static final String SESSION_SHELL = Scripts.SESSION_SHELL;

  /**
   * The argv of a persistent session's shell (vectors: {@code session.shell_argv}): {@code sh},
   * or {@link #SESSION_SHELL} in {@code workdir} (null: none).
   */
  public static List<String> sessionShellArgv(String workdir) {
    if (workdir == null) {
      return List.of("sh");
    }
    return List.of("sh", "-c", SESSION_SHELL, "sh", workdir);
  }

  /**
   * The argv of a command inside a persistent session: the command itself when it needs no
   * settings, else the wrapper with an empty mark (no trailer, no linger: the session's shell
   * stays alive between commands, so nothing is cut) and the command's stdin {@code -}.
   */
  public static List<String> sessionArgv(
      List<String> argv, Long timeoutMs, String workdir, List<Map.Entry<String, String>> env) {
    validate(argv, timeoutMs, env);
    if (timeoutMs == null && workdir == null && env.isEmpty()) {
      return List.copyOf(argv);
    }
    return remoteArgv("", STDIN_NONE, argv, timeoutMs, workdir, env);
  }

  /** How a command ended: {@code code} from the status channel, or null with the message. */
  public record ExitStatus(Integer code, String message) {}

  /**
   * The exit status in a status-channel {@code Status}: {@code Success} is 0,
   * {@code NonZeroExitCode} carries the code in a cause with reason {@code ExitCode}; anything
   * else means the command never started ({@link CommandNotStartedException}).
   */
  public static ExitStatus parseStatus(byte[] raw) {
    JsonNode s;
    try {
      s = JSON.readTree(raw);
    } catch (RuntimeException e) {
      throw new ProtocolException("bad status: " + e.getMessage(), e);
    }
    if (s == null || !s.isObject()) {
      throw new ProtocolException("bad status: not an object");
    }
    if ("Success".equals(text(s.get("status")))) {
      return new ExitStatus(0, "");
    }
    Integer code = null;
    JsonNode details = s.get("details");
    JsonNode causes = details == null ? null : details.get("causes");
    if (causes != null && causes.isArray()) {
      for (JsonNode c : causes) {
        if ("ExitCode".equals(text(c.get("reason")))) {
          String m = text(c.get("message"));
          try {
            code = Integer.parseInt(m == null ? "" : m.strip());
            break;
          } catch (NumberFormatException e) {
            // not a number: look at the next cause, as Rust's client does
          }
        }
      }
    }
    String reason = text(s.get("reason"));
    String message = text(s.get("message"));
    if ("NonZeroExitCode".equals(reason)) {
      return code != null ? new ExitStatus(code, "") : new ExitStatus(null, message == null ? "" : message);
    }
    String why = message != null && !message.isEmpty() ? message
        : reason != null && !reason.isEmpty() ? reason : "exec failed without a message";
    throw new CommandNotStartedException(why);
  }

  private static String text(JsonNode n) {
    return n == null || n.isNull() ? null : n.isString() ? n.stringValue() : n.toString();
  }

  /** A byte buffer that keeps at most {@code cap} bytes and remembers whether it dropped any. */
  public static final class Capped {
    private final java.io.ByteArrayOutputStream buf = new java.io.ByteArrayOutputStream();
    private final int cap;
    private boolean truncated;
    private long total;

    public Capped(int cap) {
      this.cap = cap;
    }

    /** Appends what fits; flags the rest as dropped. */
    public void push(byte[] b, int off, int len) {
      total += len;
      int room = cap - buf.size();
      if (len > room) {
        truncated = true;
        if (room > 0) {
          buf.write(b, off, room);
        }
      } else {
        buf.write(b, off, len);
      }
    }

    public void push(byte[] b) {
      push(b, 0, b.length);
    }

    public byte[] bytes() {
      return buf.toByteArray();
    }

    public boolean truncated() {
      return truncated;
    }

    /** Every byte pushed, kept or not. */
    public long total() {
      return total;
    }
  }

  /** Ends the memory trailer and follows the exit code in a session's end sentinel. */
  public static final String MEMORY_FLAG = "!";

  /**
   * What the wrapper prints instead of {@code mark} when the command was killed for memory:
   * {@code mark} with its last character replaced by {@code !}.
   */
  public static String memoryTrailer(String mark) {
    return mark.isEmpty() ? "" : mark.substring(0, mark.length() - 1) + MEMORY_FLAG;
  }

  /**
   * A persistent session's read of the container's OOM kill counter into {@code $_ab_k} (Rust
   * {@code remote::SESSION_OOM}): builtins only, no process.
   */
  public static final String SESSION_OOM = Scripts.SESSION_OOM;

  /** A session's end-sentinel trailer: the exit code and whether the command was killed for memory. */
  public record SessionEnd(int code, boolean memory) {}

  /** Parses a session's end-sentinel trailer; null when it is not one. */
  public static SessionEnd parseSessionEnd(String trailer) {
    String t = trailer.strip();
    boolean memory = t.endsWith(MEMORY_FLAG);
    if (memory) {
      t = t.substring(0, t.length() - MEMORY_FLAG.length());
    }
    try {
      return new SessionEnd(Integer.parseInt(t), memory);
    } catch (NumberFormatException e) {
      return null;
    }
  }

  /**
   * Holds back the trailer from one output stream (docs/protocol.md, "What the client does",
   * step 3): of what has arrived, the longest suffix that is a prefix of the mark (at most the
   * whole mark) is held, the rest passed on. So the mark never reaches the caller, and output
   * is held back only while it ends like the start of a mark. The stream is whole when what is
   * held at its end is the mark itself.
   */
  public static final class TrailerFilter {
    private final byte[] mark;
    private final byte[] memory;
    private byte[] held = new byte[0];
    private long received;

    public TrailerFilter(String mark) {
      this.mark = mark.getBytes(StandardCharsets.US_ASCII);
      this.memory = memoryTrailer(mark).getBytes(StandardCharsets.US_ASCII);
    }

    /** Feeds a chunk; returns the bytes that may go to the caller now. */
    public byte[] push(byte[] chunk) {
      received += chunk.length;
      byte[] all = new byte[held.length + chunk.length];
      System.arraycopy(held, 0, all, 0, held.length);
      System.arraycopy(chunk, 0, all, held.length, chunk.length);
      int keep = Math.min(mark.length, all.length);
      while (keep > 0 && !endsWithPrefix(all, keep)) {
        keep--;
      }
      held = java.util.Arrays.copyOfRange(all, all.length - keep, all.length);
      return java.util.Arrays.copyOfRange(all, 0, all.length - keep);
    }

    private boolean endsWithPrefix(byte[] all, int n) {
      int off = all.length - n;
      for (int i = 0; i < n; i++) {
        if (all[off + i] != mark[i] && all[off + i] != memory[i]) {
          return false;
        }
      }
      return true;
    }

    /** Whether the stream so far ends with the mark or the memory trailer. */
    public boolean complete() {
      return held.length == mark.length;
    }

    /** Whether the stream so far ends with the memory trailer: the command was killed for memory. */
    public boolean memory() {
      return mark.length > 0 && java.util.Arrays.equals(held, memory);
    }

    /** Bytes held back (a partial mark, or the whole mark once complete). */
    public byte[] held() {
      return held.clone();
    }

    /** Every byte received on this stream, the mark included. */
    public long received() {
      return received;
    }
  }

  static String utf8(byte[] b) {
    return new String(b, StandardCharsets.UTF_8);
  }
}
