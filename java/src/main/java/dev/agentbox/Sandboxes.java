package dev.agentbox;

import io.fabric8.kubernetes.api.model.GenericKubernetesResource;
import io.fabric8.kubernetes.client.KubernetesClient;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * The Sandboxes of one namespace: get-or-create by scope (the same name, labels and annotations
 * as the Rust and Python clients, so they exclude each other on one scope), open, list,
 * snapshots, restores and the scope guard. Close it to close a client it made itself.
 */
public final class Sandboxes implements AutoCloseable {
  private final Kube kube;
  private final String namespace;
  private final boolean owned;

  private Sandboxes(KubernetesClient client, String namespace, boolean owned) {
    this.kube = new Kube(client);
    this.namespace = namespace != null ? namespace
        : client.getNamespace() != null ? client.getNamespace() : "default";
    this.owned = owned;
  }

  /**
   * The Sandboxes of {@code namespace} (null: the kubeconfig's), on a client of its own. A
   * kubeconfig that cannot be read is an {@link InvalidRequestException} naming the cause.
   */
  public static Sandboxes connect(String namespace) {
    return new Sandboxes(Clients.kubernetesClient(), namespace, true);
  }

  /** The Sandboxes of {@code namespace} on a client the caller owns (and closes). */
  public static Sandboxes using(KubernetesClient client, String namespace) {
    if (client == null) {
      throw new InvalidRequestException("no Kubernetes client (null)");
    }
    return new Sandboxes(client, namespace, false);
  }

  public String namespace() {
    return namespace;
  }

  /** The fabric8 client underneath. */
  public KubernetesClient client() {
    return kube.client;
  }

  Kube kube() {
    return kube;
  }

  /**
   * Closes the client it made itself (not one passed to {@link #using}). Every call after it,
   * on these Sandboxes and the Sandbox, Session and Guard objects they gave, raises {@link
   * ClientClosedException} before any request. Idempotent; never throws.
   */
  @Override
  public void close() {
    kube.markClosed();
    if (owned) {
      try {
        kube.client.close();
      } catch (RuntimeException e) {
        // closing twice, or a pool that failed to shut down: nothing is left to use either way
      }
    }
  }

  static GenericKubernetesResource sandboxObject(String name, Scope scope, Map<String, Object> spec) {
    Map<String, Object> meta = new LinkedHashMap<>();
    meta.put("name", name);
    meta.put("labels", new LinkedHashMap<>(Labels.scopeLabels(scope)));
    Map<String, String> ann = Labels.scopeAnnotations(scope);
    if (!ann.isEmpty()) {
      meta.put("annotations", new LinkedHashMap<>(ann));
    }
    return Kube.object(Kube.SANDBOXES, meta, "spec", spec);
  }

  /**
   * The Sandbox of {@code scope}: created from {@code spec} (its scope set to {@code scope})
   * under the scope's deterministic name, or the existing one if someone created it first —
   * two racing callers, in any language, get the same Sandbox. A suspended one is resumed.
   */
  public SandboxHandle getOrCreate(Scope scope, SandboxSpec spec) {
    Map<String, Object> body = spec.toMap();
    body.put("scope", scope.toMap());
    String name = Labels.sandboxNameForScope(scope);
    String template = Kube.str(Kube.obj(body, "templateRef"), "name");
    // Fail now, not after a wait for Ready: a sandbox would wait for its template.
    if (template != null && kube.get(Kube.TEMPLATES, namespace, template) == null) {
      throw new NotFoundException("sandboxtemplate " + namespace + "/" + template + " not found");
    }
    GenericKubernetesResource obj;
    try {
      obj = kube.create(Kube.SANDBOXES, namespace, sandboxObject(name, scope, body));
    } catch (ConflictException e) {
      obj = kube.get(Kube.SANDBOXES, namespace, name);
      if (obj == null) {
        throw new ConflictException("AlreadyExists", "sandbox " + name + " exists and is being deleted", e);
      }
    } catch (ApiException e) {
      if (e.status() == 422 || e.status() == 400) {
        throw new InvalidRequestException("the API server refused the Sandbox: " + e.getMessage(), e);
      }
      throw e;
    }
    SandboxHandle s = new SandboxHandle(this, obj);
    // The name is a hash of the scope; another scope under it was made by hand.
    if (!scope.equals(s.scope())) {
      throw new ScopeMismatchException("sandbox " + name + " exists with a different scope");
    }
    if ("Suspended".equals(s.lifecycleMode())) {
      s.resume();
    }
    return s;
  }

  /** An existing Sandbox by name ({@link NotFoundException} if none). */
  public SandboxHandle open(String name) {
    GenericKubernetesResource o = kube.get(Kube.SANDBOXES, namespace, name);
    if (o == null) {
      throw new NotFoundException("sandbox " + namespace + "/" + name + " not found");
    }
    return new SandboxHandle(this, o);
  }

  /** The Sandbox of a scope, without creating it. */
  public SandboxHandle openScope(Scope scope) {
    return open(Labels.sandboxNameForScope(scope));
  }

  /** Sandboxes, optionally of one scope. */
  public List<SandboxHandle> list(Scope scope) {
    return kube.list(Kube.SANDBOXES, namespace, scope == null ? null : Labels.scopeSelector(scope))
        .stream().map(o -> new SandboxHandle(this, o)).toList();
  }

  /** The namespace's SandboxTemplates (typed). */
  public List<dev.agentbox.model.SandboxTemplate> templates() {
    return kube.call(() -> kube.client.resources(dev.agentbox.model.SandboxTemplate.class)
        .inNamespace(namespace).list().getItems(), "sandboxtemplates " + namespace);
  }

  /** The namespace's SandboxPools (typed). */
  public List<dev.agentbox.model.SandboxPool> pools() {
    return kube.call(() -> kube.client.resources(dev.agentbox.model.SandboxPool.class)
        .inNamespace(namespace).list().getItems(), "sandboxpools " + namespace);
  }

  /**
   * Creates a Sandbox (the scope's name unless {@code name}) whose fresh workspace is restored
   * from the Ready snapshot {@code snapshot} ({@code snapshot.restore: Named}).
   */
  public SandboxHandle createRestored(Scope scope, SandboxSpec spec, String snapshot, String name) {
    Snapshot snap = getSnapshot(snapshot);
    if (!snap.ready()) {
      throw new SnapshotFailedException(snapshot, snap.phase(), "NotReady", "only a Ready snapshot can be restored");
    }
    Map<String, Object> body = spec.toMap();
    body.put("scope", scope.toMap());
    Map<String, Object> sn = new LinkedHashMap<>(Kube.obj(body, "snapshot"));
    sn.put("restore", "Named");
    sn.put("name", snapshot);
    body.put("snapshot", sn);
    GenericKubernetesResource o = kube.create(Kube.SANDBOXES, namespace,
        sandboxObject(name != null ? name : Labels.sandboxNameForScope(scope), scope, body));
    return new SandboxHandle(this, o);
  }

  /** A SandboxSnapshot by name. */
  public Snapshot getSnapshot(String name) {
    GenericKubernetesResource o = kube.get(Kube.SNAPSHOTS, namespace, name);
    if (o == null) {
      throw new NotFoundException("sandboxsnapshot " + namespace + "/" + name + " not found");
    }
    return Snapshot.from(o);
  }

  /** Waits (on a watch) until a snapshot is Ready; {@link SnapshotFailedException} otherwise. */
  public Snapshot waitSnapshot(String name, long timeoutMs) {
    GenericKubernetesResource o = kube.watchUntil(Kube.SNAPSHOTS, namespace, name, obj -> {
      if (obj == null) {
        throw new NotFoundException("sandboxsnapshot " + namespace + "/" + name + " was deleted");
      }
      String phase = Kube.str(Kube.obj(obj.getAdditionalProperties(), "status"), "phase");
      if ("Failed".equals(phase)) {
        String[] rm = SandboxHandle.failingCondition(obj);
        throw new SnapshotFailedException(name, "Failed", rm[0].isEmpty() ? "Failed" : rm[0], rm[1]);
      }
      return "Ready".equals(phase);
    }, timeoutMs);
    if (o == null) {
      GenericKubernetesResource last = kube.get(Kube.SNAPSHOTS, namespace, name);
      String phase = last == null ? "Pending" : String.valueOf(Kube.obj(last.getAdditionalProperties(), "status").getOrDefault("phase", "Pending"));
      throw new SnapshotFailedException(name, phase, "Timeout", "not Ready after " + timeoutMs + " ms");
    }
    return Snapshot.from(o);
  }

  /** A scope's lineage: its snapshots, oldest first (the operator's order). */
  public List<Snapshot> snapshots(Scope scope) {
    return Snapshot.sorted(kube.list(Kube.SNAPSHOTS, namespace, Labels.scopeSelector(scope))
        .stream().map(Snapshot::from).toList());
  }

  /** The execution guard of a scope ({@code waitMs} null: wait indefinitely). Acquire it. */
  public Guard guard(Scope scope, Long waitMs, GuardConfig config) {
    kube.ensureOpen();
    String key = Labels.scopeKey(scope);
    return new Guard(kube, namespace, Labels.leaseName(key), Labels.scopeLabels(scope),
        config != null ? config : GuardConfig.defaults(), waitMs);
  }

  // ---- the harness's shapes ----

  /** The sandbox of a harness state: opened, or created from {@code spec} if gone. */
  public SandboxHandle open(SandboxState state, SandboxSpec spec) {
    if (!state.namespace().equals(namespace)) {
      throw new InvalidRequestException("state of namespace " + state.namespace() + ", not " + namespace);
    }
    GenericKubernetesResource o = kube.get(Kube.SANDBOXES, namespace, state.sandbox());
    if (o != null) {
      return new SandboxHandle(this, o);
    }
    return getOrCreate(state.scope(), spec);
  }

  /**
   * Snapshots the workspace of the state's sandbox (the bytes go from the pod to the object
   * store, never through the JVM), waits until Ready, and returns the state with it as its last
   * snapshot: a small reference a harness stores instead of an archive.
   */
  public SandboxState persistWorkspace(SandboxState state, long timeoutMs) {
    SandboxHandle s = open(state.sandbox());
    Snapshot snap = s.snapshot(null, true, timeoutMs);
    return state.withLastSnapshot(snap.name());
  }

  /**
   * Restores the state's last snapshot in the cluster: the sandbox is recreated with that
   * workspace (or created, if it is gone) and waited for. Without a last snapshot, the
   * sandbox of the state is got or created as it is.
   */
  public SandboxHandle hydrateWorkspace(SandboxState state, SandboxSpec spec, long timeoutMs) {
    if (state.lastSnapshot() == null) {
      return open(state, spec).waitReady(timeoutMs);
    }
    GenericKubernetesResource o = kube.get(Kube.SANDBOXES, namespace, state.sandbox());
    SandboxHandle s = o == null
        ? createRestored(state.scope(), spec, state.lastSnapshot(), state.sandbox())
        : new SandboxHandle(this, o).restore(state.lastSnapshot(), timeoutMs);
    return s.waitReady(timeoutMs);
  }
}
