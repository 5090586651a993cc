package dev.agentbox;

/** An object (Sandbox, snapshot, template, pod) that does not exist. */
public class NotFoundException extends AgentboxException {
  private static final long serialVersionUID = 1L;

  public NotFoundException(String message) {
    super(message);
  }

  public NotFoundException(String message, Throwable cause) {
    super(message, cause);
  }
}
