package dev.agentbox;

/** The Sandbox's spec suspends it: resume it rather than wait. */
public class SandboxSuspendedException extends SandboxNotReadyException {
  private static final long serialVersionUID = 1L;

  public SandboxSuspendedException(String name, String phase, String reason, String message) {
    super(name, phase, reason, message);
  }
}
