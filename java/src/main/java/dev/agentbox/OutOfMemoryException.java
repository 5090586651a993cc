package dev.agentbox;

/**
 * The command was killed for memory: the kernel's OOM killer ended it when its container reached
 * its memory limit (exit code 137 with the container's OOM kill counter risen while it ran), or,
 * with {@link #container()}, the whole sandbox container was killed for memory (the kubelet's
 * {@code OOMKilled}) while it ran, every process in it with it. Raise the sandbox's
 * {@code resources.limits.memory} or make the command use less; running it again as it is will
 * most likely end the same way.
 */
public class OutOfMemoryException extends ExecException {
  private static final long serialVersionUID = 1L;
  private final boolean container;

  public OutOfMemoryException(boolean container) {
    super(container
        ? "out of memory: the sandbox's container was killed for memory (OOMKilled) while the"
            + " command ran, and every process in it with it; raise the sandbox's"
            + " resources.limits.memory"
        : "out of memory: the command was killed for memory (the kernel's OOM killer, exit code"
            + " 137) when its container reached its memory limit; raise the sandbox's"
            + " resources.limits.memory");
    this.container = container;
  }

  /** The whole container was killed (sessions and every process in it), not only the command. */
  public boolean container() {
    return container;
  }
}
