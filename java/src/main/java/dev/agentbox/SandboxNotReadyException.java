package dev.agentbox;

/** A Sandbox did not become Ready (timeout); the subclasses say when waiting is pointless. */
public class SandboxNotReadyException extends AgentboxException {
  private static final long serialVersionUID = 1L;
  private final String name;
  private final String phase;
  private final String reason;

  public SandboxNotReadyException(String name, String phase, String reason, String message) {
    super("sandbox " + name + " is not ready (phase " + (phase.isEmpty() ? "unknown" : phase)
        + (reason.isEmpty() ? "" : ", " + reason) + ")" + (message.isEmpty() ? "" : ": " + message));
    this.name = name;
    this.phase = phase;
    this.reason = reason;
  }

  public String name() {
    return name;
  }

  public String phase() {
    return phase;
  }

  /** The failing condition's reason ({@code ImagePullFailed}, {@code Stalled}, ...). */
  public String reason() {
    return reason;
  }
}
