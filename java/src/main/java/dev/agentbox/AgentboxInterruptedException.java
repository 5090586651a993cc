package dev.agentbox;

/**
 * The calling thread was interrupted (by {@code Future.cancel(true)}, an executor's {@code
 * shutdownNow}, or {@link Guard#run} when the guard is lost) while the client waited. The
 * thread's interrupt flag is set again, as after any {@link InterruptedException} caught; a
 * command running under {@link SandboxHandle#exec} was killed in the pod with everything it
 * started.
 */
public class AgentboxInterruptedException extends AgentboxException {
  private static final long serialVersionUID = 1L;

  public AgentboxInterruptedException(String message, Throwable cause) {
    super(message, cause);
  }
}
