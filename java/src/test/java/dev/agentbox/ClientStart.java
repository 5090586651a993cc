package dev.agentbox;

/**
 * A harness's JVM that starts a client and makes one call (LoggingTest runs it in a JVM of its
 * own, since SLF4J starts once per JVM): the kubeconfig of {@code -Dkubeconfig} names a loopback
 * port nothing listens on, so the call fails at once. Prints what LoggingTest checks on stdout.
 */
public final class ClientStart {
  private ClientStart() {}

  public static void main(String[] args) {
    try (Sandboxes s = Sandboxes.connect(null)) {
      try {
        s.list(null);
        System.out.println("unexpected: the call succeeded");
      } catch (TransportException e) {
        System.out.println("call failed as expected");
      }
    }
    System.out.println("slf4j.provider=" + System.getProperty("slf4j.provider"));
    System.out.println("done");
  }
}
