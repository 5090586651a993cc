package dev.agentbox;

/** A file is larger than the read cap. */
public class FileTooLargeException extends AgentboxException {
  private static final long serialVersionUID = 1L;

  public FileTooLargeException(String message) {
    super(message);
  }

  public FileTooLargeException(String message, Throwable cause) {
    super(message, cause);
  }
}
