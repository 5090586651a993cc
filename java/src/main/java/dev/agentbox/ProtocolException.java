package dev.agentbox;

/** The API server or the pod answered something this client cannot read. */
public class ProtocolException extends AgentboxException {
  private static final long serialVersionUID = 1L;

  public ProtocolException(String message) {
    super(message);
  }

  public ProtocolException(String message, Throwable cause) {
    super(message, cause);
  }
}
