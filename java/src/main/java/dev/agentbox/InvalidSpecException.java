package dev.agentbox;

/**
 * A 422: the API server refused an object as invalid (its schema or CEL rules). Still an {@link
 * ApiException} of status 422, so code that catches that keeps working.
 */
public class InvalidSpecException extends ApiException {
  private static final long serialVersionUID = 1L;

  public InvalidSpecException(String reason, String message, Throwable cause) {
    super(422, reason, message, cause);
  }
}
