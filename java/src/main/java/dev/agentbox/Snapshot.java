package dev.agentbox;

import io.fabric8.kubernetes.api.model.GenericKubernetesResource;
import java.util.Comparator;
import java.util.List;
import java.util.Map;

/**
 * A SandboxSnapshot as last read: one immutable workspace tarball in the object store (the bytes
 * never pass through the harness: the operator streams them from the pod to the store).
 */
public record Snapshot(
    String name,
    String sandbox,
    String phase,
    String scopeKey,
    String sha256,
    Long sizeBytes,
    Long members,
    Long fencingToken,
    String objectKey,
    String createdAt,
    String completedAt) {

  static Snapshot from(GenericKubernetesResource o) {
    Map<String, Object> st = Kube.obj(o.getAdditionalProperties(), "status");
    Map<String, Object> spec = Kube.obj(o.getAdditionalProperties(), "spec");
    Map<String, String> labels = o.getMetadata().getLabels();
    String key = Kube.str(st, "scopeKey");
    if (key == null) {
      key = labels == null ? "" : labels.getOrDefault(Labels.SCOPE_KEY, "");
    }
    String phase = Kube.str(st, "phase");
    return new Snapshot(
        o.getMetadata().getName(),
        String.valueOf(Kube.obj(spec, "sandboxRef").getOrDefault("name", "")),
        phase == null ? "" : phase,
        key,
        Kube.str(st, "sha256"),
        Kube.num(st, "sizeBytes"),
        Kube.num(st, "members"),
        Kube.num(st, "fencingToken"),
        Kube.str(st, "objectKey"),
        o.getMetadata().getCreationTimestamp() == null ? "" : o.getMetadata().getCreationTimestamp(),
        Kube.str(st, "completedAt"));
  }

  /** Whether it can be restored. */
  public boolean ready() {
    return "Ready".equals(phase);
  }

  /**
   * A scope's order, as the operator's {@code snapshot::age}: unfinished first, then completion
   * time, fencing token, name.
   */
  static final Comparator<Snapshot> AGE = Comparator
      .comparing((Snapshot s) -> s.completedAt() != null)
      .thenComparing(s -> s.completedAt() == null ? "" : s.completedAt())
      .thenComparing(s -> s.fencingToken() == null ? 0L : s.fencingToken())
      .thenComparing(Snapshot::name);

  static List<Snapshot> sorted(List<Snapshot> l) {
    return l.stream().sorted(AGE).toList();
  }
}
