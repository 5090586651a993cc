package dev.agentbox;

/** The API server could not be reached, or a connection broke. */
public class TransportException extends AgentboxException {
  private static final long serialVersionUID = 1L;

  public TransportException(String message) {
    super(message);
  }

  public TransportException(String message, Throwable cause) {
    super(message, cause);
  }
}
