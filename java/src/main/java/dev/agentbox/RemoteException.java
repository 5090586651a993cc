package dev.agentbox;

/** A file operation's script failed in the pod: its exit code and stderr. */
public class RemoteException extends AgentboxException {
  private static final long serialVersionUID = 1L;
  private final Integer exitCode;

  public RemoteException(Integer exitCode, String stderr) {
    super("remote command failed (exit " + exitCode + "): " + stderr);
    this.exitCode = exitCode;
  }

  public Integer exitCode() {
    return exitCode;
  }
}
