package dev.agentbox;

/** A Sandbox exists under a scope's name with another scope (made by hand). */
public class ScopeMismatchException extends AgentboxException {
  private static final long serialVersionUID = 1L;

  public ScopeMismatchException(String message) {
    super(message);
  }

  public ScopeMismatchException(String message, Throwable cause) {
    super(message, cause);
  }
}
