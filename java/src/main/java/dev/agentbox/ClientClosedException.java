package dev.agentbox;

/**
 * The client was closed: {@link Sandboxes#close()} (or the fabric8 client under {@link
 * Sandboxes#using} closed by its owner), or the {@link Session} closed. Raised before any
 * request is made; open a new {@link Sandboxes} to go on.
 */
public class ClientClosedException extends AgentboxException {
  private static final long serialVersionUID = 1L;

  public ClientClosedException(String message) {
    super(message);
  }

  public ClientClosedException(String message, Throwable cause) {
    super(message, cause);
  }
}
