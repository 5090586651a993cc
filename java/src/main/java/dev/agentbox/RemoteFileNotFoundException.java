package dev.agentbox;

/** A workspace path that is missing or of the wrong type (the file scripts' exit 96). */
public class RemoteFileNotFoundException extends NotFoundException {
  private static final long serialVersionUID = 1L;

  public RemoteFileNotFoundException(String message) {
    super(message);
  }
}
