package dev.agentbox;

/**
 * A deleted Sandbox still existed when {@link SandboxHandle#delete(boolean, long)} stopped
 * waiting: a timeout (its finalizer's cleanup — the on-stop snapshot, the pod, the workspace —
 * was not done in time), not a Sandbox that failed to become Ready.
 */
public class SandboxNotDeletedException extends AgentboxException {
  private static final long serialVersionUID = 1L;
  private final String name;
  private final long timeoutMs;

  public SandboxNotDeletedException(String name, long timeoutMs) {
    super("sandbox " + name + " still exists " + timeoutMs + " ms after its deletion");
    this.name = name;
    this.timeoutMs = timeoutMs;
  }

  public String name() {
    return name;
  }

  /** How long the client waited. */
  public long timeoutMs() {
    return timeoutMs;
  }
}
