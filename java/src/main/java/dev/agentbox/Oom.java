package dev.agentbox;

import io.fabric8.kubernetes.api.model.GenericKubernetesResource;
import java.time.Duration;
import java.time.Instant;
import java.time.format.DateTimeParseException;
import java.util.List;
import java.util.Map;
import java.util.function.Supplier;

/**
 * Out of memory, as the kubelet records it (docs/protocol.md, "Out of memory"). A command the
 * kernel's OOM killer ends while its container lives on is told by the wrapper itself (its memory
 * trailer, {@link Wire#memoryTrailer}); a whole container killed for memory (under gVisor the
 * sandbox's own runtime counts against {@code limits.memory}, so running out ends every process
 * in it) breaks the exec's connection, and the client finds the kubelet's {@code OOMKilled} in
 * the pod's status.
 */
public final class Oom {
  private Oom() {}

  /** The kubelet's reason for a container the kernel killed for memory. */
  public static final String OOM_KILLED = "OOMKilled";
  /** How far before an exec's start an {@code OOMKilled} may have finished and still count. */
  public static final Duration CLOCK_SKEW = Duration.ofSeconds(5);
  /** How long a client looks for the kubelet's record after an exec failed. */
  public static final Duration SETTLE = Duration.ofSeconds(10);
  /** How often it looks meanwhile. */
  public static final Duration POLL = Duration.ofMillis(400);

  /**
   * Whether {@code pod} (a pod as a JSON map) records {@code container} killed for memory (reason
   * {@code OOMKilled} in its state or last state) at or after {@code since} less
   * {@link #CLOCK_SKEW}; a termination without {@code finishedAt} counts (vectors:
   * {@code oom.container}).
   */
  public static boolean killedSince(Map<String, Object> pod, String container, Instant since) {
    Object statuses = Kube.obj(pod, "status").get("containerStatuses");
    if (!(statuses instanceof List<?> list)) {
      return false;
    }
    Instant after = since.minus(CLOCK_SKEW);
    for (Object c : list) {
      if (!container.equals(Kube.str(c, "name"))) {
        continue;
      }
      for (String key : new String[] {"state", "lastState"}) {
        Map<String, Object> t = Kube.obj(Kube.obj(c, key), "terminated");
        if (!OOM_KILLED.equals(Kube.str(t, "reason"))) {
          continue;
        }
        String finished = Kube.str(t, "finishedAt");
        if (finished == null || finished.isEmpty()) {
          return true;
        }
        try {
          if (!Instant.parse(finished).isBefore(after)) {
            return true;
          }
        } catch (DateTimeParseException e) {
          // Not a time this client can read: not known to be this exec's.
        }
      }
    }
    return false;
  }

  /** Whether an exec failure is one a dead container explains. */
  static boolean deadContainerFailure(RuntimeException e) {
    return e instanceof TransportException || e instanceof OutputCutException
        || e instanceof CommandNotStartedException || e instanceof SessionException;
  }

  /**
   * Runs {@code exec}; a failure a dead container explains (a cut stream, a broken connection, a
   * command or session that could not go on) becomes an {@link OutOfMemoryException} (container)
   * when the kubelet recorded the sandbox's container {@code OOMKilled} since the exec began
   * (looking for up to {@link #SETTLE}).
   */
  static <T> T explained(Kube kube, String ns, String pod, Supplier<T> exec) {
    Instant since = Instant.now();
    try {
      return exec.get();
    } catch (RuntimeException e) {
      if (deadContainerFailure(e) && containerKilledSince(kube, ns, pod, since)) {
        OutOfMemoryException oom = new OutOfMemoryException(true);
        oom.initCause(e);
        throw oom;
      }
      throw e;
    }
  }

  static boolean containerKilledSince(Kube kube, String ns, String pod, Instant since) {
    long until = System.nanoTime() + SETTLE.toNanos();
    while (true) {
      try {
        GenericKubernetesResource p = kube.get(Kube.PODS, ns, pod);
        if (p == null) {
          return false;
        }
        if (killedSince(p.getAdditionalProperties(), Wire.SANDBOX_CONTAINER, since)) {
          return true;
        }
      } catch (AgentboxException e) {
        // The API server out of reach: not known to be out of memory (and an unreachable
        // server should not cost the caller the settle time too).
        return false;
      }
      if (System.nanoTime() + POLL.toNanos() > until) {
        return false;
      }
      try {
        Thread.sleep(POLL.toMillis());
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        return false;
      }
    }
  }
}
