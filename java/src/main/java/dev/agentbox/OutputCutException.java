package dev.agentbox;

/**
 * A command's stdout or stderr did not end with its trailer: the connection closed before all
 * of its output arrived (kubernetes/kubernetes#124571). Never a short result instead.
 */
public class OutputCutException extends ExecException {
  private static final long serialVersionUID = 1L;
  private final String stream;
  private final long received;

  public OutputCutException(String stream, long received) {
    super("the command's " + stream + " was cut: " + received
        + " bytes arrived without the trailer that ends it");
    this.stream = stream;
    this.received = received;
  }

  /** {@code stdout} or {@code stderr}. */
  public String stream() {
    return stream;
  }

  /** The bytes of that stream that arrived. */
  public long received() {
    return received;
  }
}
