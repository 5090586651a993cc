package dev.agentbox;

/** A request refused before anything was sent (bad scope, argv, environment name, timeout). */
public class InvalidRequestException extends AgentboxException {
  private static final long serialVersionUID = 1L;

  public InvalidRequestException(String message) {
    super(message);
  }

  public InvalidRequestException(String message, Throwable cause) {
    super(message, cause);
  }
}
