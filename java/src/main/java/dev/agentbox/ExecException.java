package dev.agentbox;

/** A command could not be run or its result not read whole. */
public class ExecException extends AgentboxException {
  private static final long serialVersionUID = 1L;

  public ExecException(String message) {
    super(message);
  }

  public ExecException(String message, Throwable cause) {
    super(message, cause);
  }
}
