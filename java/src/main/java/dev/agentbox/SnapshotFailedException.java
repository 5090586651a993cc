package dev.agentbox;

/** A snapshot failed, is not Ready to restore, or was not Ready in time. */
public class SnapshotFailedException extends AgentboxException {
  private static final long serialVersionUID = 1L;
  private final String reason;

  public SnapshotFailedException(String name, String phase, String reason, String message) {
    super("snapshot " + name + " (phase " + phase + ", " + reason + "): " + message);
    this.reason = reason;
  }

  public String reason() {
    return reason;
  }
}
