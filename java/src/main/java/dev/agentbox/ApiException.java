package dev.agentbox;

/** The API server refused a request: its HTTP status, reason and message. */
public class ApiException extends AgentboxException {
  private static final long serialVersionUID = 1L;
  private final int status;
  private final String reason;

  public ApiException(int status, String reason, String message, Throwable cause) {
    super(message, cause);
    this.status = status;
    this.reason = reason == null ? "" : reason;
  }

  /** The HTTP status (0 when none arrived). */
  public int status() {
    return status;
  }

  /** The Status reason (``AlreadyExists``, ``Invalid``, ...), or empty. */
  public String reason() {
    return reason;
  }
}
