package dev.agentbox;

/** A persistent session's shell failed or its framing broke. */
public class SessionException extends ExecException {
  private static final long serialVersionUID = 1L;

  public SessionException(String message) {
    super(message);
  }

  public SessionException(String message, Throwable cause) {
    super(message, cause);
  }
}
