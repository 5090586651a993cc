package dev.agentbox;

/**
 * The root of every error this client raises. Unchecked, like fabric8's own
 * {@code KubernetesClientException}: a harness catches the subclasses it can act on.
 */
public class AgentboxException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  public AgentboxException(String message) {
    super(message);
  }

  public AgentboxException(String message, Throwable cause) {
    super(message, cause);
  }
}
