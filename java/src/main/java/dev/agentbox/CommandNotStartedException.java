package dev.agentbox;

/** The command never started (the runtime said so on the status channel). */
public class CommandNotStartedException extends ExecException {
  private static final long serialVersionUID = 1L;

  public CommandNotStartedException(String message) {
    super(message);
  }

  public CommandNotStartedException(String message, Throwable cause) {
    super(message, cause);
  }
}
