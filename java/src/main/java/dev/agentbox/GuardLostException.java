package dev.agentbox;

/** The guard was lost (taken over, deleted, or not renewed in time): stop the guarded work. */
public class GuardLostException extends GuardException {
  private static final long serialVersionUID = 1L;

  public GuardLostException(String lease) {
    super("lost lease " + lease);
  }
}
