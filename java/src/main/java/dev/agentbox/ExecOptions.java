package dev.agentbox;

import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.AbstractMap;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;

/**
 * One command and how to run it: argv (or a shell string for {@code sh -c}), stdin (bytes of a
 * known length, or a stream read until its end), environment, working directory, a timeout
 * that kills the command's process group in the pod, a cap on each output stream, and whether
 * a non-zero exit raises {@link CommandException}.
 */
public final class ExecOptions {
  final List<String> argv;
  byte[] stdinBytes;
  InputStream stdinStream;
  Long timeoutMs;
  String workdir;
  final List<Map.Entry<String, String>> env = new ArrayList<>();
  int maxOutput = Wire.DEFAULT_MAX_OUTPUT;
  java.io.OutputStream stdoutSink;
  boolean check;

  private ExecOptions(List<String> argv) {
    if (argv == null || argv.contains(null)) {
      throw new InvalidRequestException("invalid exec request: argv is null or holds null");
    }
    this.argv = List.copyOf(argv);
  }

  /** An argv, run as is (no shell). */
  public static ExecOptions argv(String... argv) {
    return new ExecOptions(argv == null ? null : java.util.Arrays.asList(argv));
  }

  /** An argv, run as is (no shell). */
  public static ExecOptions argv(List<String> argv) {
    return new ExecOptions(argv);
  }

  /** A shell command line: {@code sh -c command}. */
  public static ExecOptions shell(String command) {
    return new ExecOptions(java.util.Arrays.asList("sh", "-c", command));
  }

  /** Stdin of a known length: the command reads exactly these bytes, then EOF. */
  public ExecOptions stdin(byte[] data) {
    if (data == null) {
      throw new InvalidRequestException("stdin bytes are null");
    }
    this.stdinBytes = data.clone();
    this.stdinStream = null;
    return this;
  }

  /** Stdin as UTF-8 text. */
  public ExecOptions stdin(String text) {
    if (text == null) {
      throw new InvalidRequestException("stdin text is null");
    }
    return stdin(text.getBytes(StandardCharsets.UTF_8));
  }

  /** Stdin streamed from {@code in} until its end (read on a thread of its own, then closed). */
  public ExecOptions stdin(InputStream in) {
    if (in == null) {
      throw new InvalidRequestException("stdin stream is null");
    }
    this.stdinStream = in;
    this.stdinBytes = null;
    return this;
  }

  public ExecOptions timeout(Duration d) {
    this.timeoutMs = d == null ? null : d.toMillis();
    return this;
  }

  public ExecOptions workdir(String dir) {
    this.workdir = dir;
    return this;
  }

  /** Adds one environment variable (in order). */
  public ExecOptions env(String name, String value) {
    env.add(new AbstractMap.SimpleImmutableEntry<>(name, value));
    return this;
  }

  public ExecOptions env(Map<String, String> vars) {
    vars.forEach(this::env);
    return this;
  }

  public ExecOptions maxOutput(int bytes) {
    if (bytes < 0) {
      throw new InvalidRequestException("maxOutput must not be negative");
    }
    this.maxOutput = bytes;
    return this;
  }

  /**
   * Streams stdout to {@code out} as it arrives (the trailer held back) instead of collecting
   * it: the result's stdout is then empty. For output of any size (a tar of a directory).
   */
  public ExecOptions stdoutTo(java.io.OutputStream out) {
    this.stdoutSink = out;
    return this;
  }

  /** Raise {@link CommandException} on a non-zero exit. */
  public ExecOptions check() {
    this.check = true;
    return this;
  }

  public List<String> argvList() {
    return argv;
  }

  public Long timeoutMillis() {
    return timeoutMs;
  }

  public String workdirOrNull() {
    return workdir;
  }

  public List<Map.Entry<String, String>> envList() {
    return List.copyOf(env);
  }
}
