package dev.agentbox;

/** A 409: the object exists already, or was changed since it was read. */
public class ConflictException extends ApiException {
  private static final long serialVersionUID = 1L;

  public ConflictException(String reason, String message, Throwable cause) {
    super(409, reason, message, cause);
  }
}
