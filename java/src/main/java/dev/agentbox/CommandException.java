package dev.agentbox;

/** A command run with check exited non-zero; {@link #result()} has its output. */
public class CommandException extends ExecException {
  private static final long serialVersionUID = 1L;
  private final transient ExecResult result;

  public CommandException(ExecResult result) {
    super("command exited with code " + result.exitCode() + ": " + tail(result.stderrText()));
    this.result = result;
  }

  static String tail(String s) {
    return s.length() <= 500 ? s : s.substring(s.length() - 500);
  }

  public ExecResult result() {
    return result;
  }
}
