package dev.agentbox;

/**
 * A workspace path refused by the path confiner: {@code reason} is {@code DotDot} ({@code ..}
 * anywhere), {@code OutsideRoot} (absolute, outside the root), {@code Invalid} (NUL, a bad
 * root) or {@code Escapes} (resolves outside the workspace in the pod, through a symlink).
 */
public class PathException extends InvalidRequestException {
  private static final long serialVersionUID = 1L;
  private final String path;
  private final String reason;

  public PathException(String path, String reason, String message) {
    super(message);
    this.path = path;
    this.reason = reason;
  }

  public String path() {
    return path;
  }

  public String reason() {
    return reason;
  }
}
