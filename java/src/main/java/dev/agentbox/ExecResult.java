package dev.agentbox;

import java.nio.charset.StandardCharsets;

/**
 * The collected result of a command: its real exit code (null when the runtime reported none,
 * with {@code statusMessage}), stdout and stderr (each capped, with truncation flags).
 */
public record ExecResult(
    Integer exitCode,
    byte[] stdout,
    byte[] stderr,
    boolean stdoutTruncated,
    boolean stderrTruncated,
    boolean timedOut,
    String statusMessage) {

  /** Exit code 0 and no timeout. */
  public boolean ok() {
    return exitCode != null && exitCode == 0 && !timedOut;
  }

  /** Either stream was cut at the cap. */
  public boolean truncated() {
    return stdoutTruncated || stderrTruncated;
  }

  /** N when the exit code is 128+N (a killed process), else null. */
  public Integer signal() {
    return exitCode != null && exitCode >= 129 && exitCode <= 192 ? exitCode - 128 : null;
  }

  public String stdoutText() {
    return new String(stdout, StandardCharsets.UTF_8);
  }

  public String stderrText() {
    return new String(stderr, StandardCharsets.UTF_8);
  }

  /** Itself if the exit code is 0, else {@link CommandException}. */
  public ExecResult check() {
    if (exitCode == null || exitCode != 0) {
      throw new CommandException(this);
    }
    return this;
  }
}
