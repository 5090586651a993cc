package dev.agentbox;

/**
 * The command's timeout passed; its whole process group was killed in the pod. {@link
 * #result()} holds what it printed until then and the status after the kill (null when no
 * status arrived at all).
 */
public class ExecTimeoutException extends ExecException {
  private static final long serialVersionUID = 1L;
  private final transient ExecResult result;

  public ExecTimeoutException(String message, ExecResult result) {
    super(message);
    this.result = result;
  }

  public ExecResult result() {
    return result;
  }
}
