package dev.agentbox;

/** The guard was not acquired before the deadline; {@link #holder()} held it last. */
public class GuardTimeoutException extends GuardException {
  private static final long serialVersionUID = 1L;
  private final String holder;

  public GuardTimeoutException(String lease, String holder) {
    super("timed out waiting for lease " + lease + " (held by " + (holder.isEmpty() ? "nobody" : holder) + ")");
    this.holder = holder;
  }

  public String holder() {
    return holder;
  }
}
