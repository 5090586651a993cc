package dev.agentbox;

/** The scope guard could not be acquired or was lost. */
public class GuardException extends AgentboxException {
  private static final long serialVersionUID = 1L;

  public GuardException(String message) {
    super(message);
  }

  public GuardException(String message, Throwable cause) {
    super(message, cause);
  }
}
