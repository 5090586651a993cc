package dev.agentbox;

/** The Sandbox failed, or its start is Stalled: it will not become Ready by waiting. */
public class SandboxFailedException extends SandboxNotReadyException {
  private static final long serialVersionUID = 1L;

  public SandboxFailedException(String name, String phase, String reason, String message) {
    super(name, phase, reason, message);
  }
}
