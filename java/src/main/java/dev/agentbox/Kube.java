package dev.agentbox;

import io.fabric8.kubernetes.api.model.GenericKubernetesResource;
import io.fabric8.kubernetes.client.KubernetesClient;
import io.fabric8.kubernetes.client.KubernetesClientException;
import io.fabric8.kubernetes.client.dsl.base.PatchContext;
import io.fabric8.kubernetes.client.dsl.base.PatchType;
import io.fabric8.kubernetes.client.dsl.base.ResourceDefinitionContext;
import java.io.IOException;
import java.util.List;
import java.util.Map;
import java.util.function.Supplier;

/**
 * The API calls this client makes, at the JSON level (as the Python SDK does) on fabric8's
 * generic resources, with fabric8's errors mapped to this client's hierarchy.
 */
final class Kube {
  static {
    Logging.quietIfUnconfigured(); // before fabric8's classes start SLF4J
  }

  static final String GROUP = "agentbox.dev";
  static final String VERSION = "v1alpha1";

  static final ResourceDefinitionContext SANDBOXES = ctx(GROUP, VERSION, "Sandbox", "sandboxes");
  static final ResourceDefinitionContext SNAPSHOTS =
      ctx(GROUP, VERSION, "SandboxSnapshot", "sandboxsnapshots");
  static final ResourceDefinitionContext TEMPLATES =
      ctx(GROUP, VERSION, "SandboxTemplate", "sandboxtemplates");
  static final ResourceDefinitionContext POOLS = ctx(GROUP, VERSION, "SandboxPool", "sandboxpools");
  static final ResourceDefinitionContext LEASES = ctx("coordination.k8s.io", "v1", "Lease", "leases");
  static final ResourceDefinitionContext PODS = ctx("", "v1", "Pod", "pods");

  private static ResourceDefinitionContext ctx(String group, String version, String kind, String plural) {
    return new ResourceDefinitionContext.Builder()
        .withGroup(group)
        .withVersion(version)
        .withKind(kind)
        .withPlural(plural)
        .withNamespaced(true)
        .build();
  }

  final KubernetesClient client;
  /** Set by {@link Sandboxes#close()}: every call after it is refused before any request. */
  private volatile boolean closed;

  Kube(KubernetesClient client) {
    this.client = client;
  }

  void markClosed() {
    closed = true;
  }

  /** Whether this client (or the fabric8 client under it, closed by its owner) is closed. */
  boolean isClosed() {
    if (closed) {
      return true;
    }
    try {
      return client.getHttpClient().isClosed();
    } catch (RuntimeException e) {
      return false; // a client that cannot say: the call itself reports what is wrong
    }
  }

  /** {@link ClientClosedException} if closed: raised before any request. */
  void ensureOpen() {
    if (isClosed()) {
      throw new ClientClosedException("the agentbox client is closed (Sandboxes.close(), or its "
          + "fabric8 client closed by its owner): open a new Sandboxes");
    }
  }

  static String apiVersion(ResourceDefinitionContext c) {
    return c.getGroup() == null || c.getGroup().isEmpty()
        ? c.getVersion()
        : c.getGroup() + "/" + c.getVersion();
  }

  /** The object, or null when it does not exist. */
  GenericKubernetesResource get(ResourceDefinitionContext c, String ns, String name) {
    return call(() -> client.genericKubernetesResources(c).inNamespace(ns).withName(name).get(),
        c, ns, name);
  }

  List<GenericKubernetesResource> list(ResourceDefinitionContext c, String ns, String selector) {
    return call(() -> {
      var op = client.genericKubernetesResources(c).inNamespace(ns);
      return (selector == null ? op.list() : op.withLabelSelector(selector).list()).getItems();
    }, c, ns, "");
  }

  GenericKubernetesResource create(ResourceDefinitionContext c, String ns, GenericKubernetesResource o) {
    return call(() -> client.genericKubernetesResources(c).inNamespace(ns).resource(o).create(),
        c, ns, o.getMetadata().getName());
  }

  /** A PUT conditioned on the body's resourceVersion (a 409 when it changed). */
  GenericKubernetesResource update(ResourceDefinitionContext c, String ns, GenericKubernetesResource o) {
    return call(() -> client.genericKubernetesResources(c).inNamespace(ns).resource(o).update(),
        c, ns, o.getMetadata().getName());
  }

  GenericKubernetesResource mergePatch(ResourceDefinitionContext c, String ns, String name, String patch) {
    return call(() -> client.genericKubernetesResources(c).inNamespace(ns).withName(name)
        .patch(new PatchContext.Builder().withPatchType(PatchType.JSON_MERGE).build(), patch), c, ns, name);
  }

  /** Deletes; false when it was not there. */
  boolean delete(ResourceDefinitionContext c, String ns, String name) {
    return call(() -> !client.genericKubernetesResources(c).inNamespace(ns).withName(name).delete().isEmpty(),
        c, ns, name);
  }

  /** Decides on one state of a watched object (null: deleted); throws to end the wait. */
  interface Decide {
    boolean done(GenericKubernetesResource obj);
  }

  /**
   * Watches one object until {@code decide} says done (returning the object) or throws, or
   * until the timeout (returning null). Reads it first, then watches from that version; a
   * watch that closes is started again from a fresh read.
   */
  GenericKubernetesResource watchUntil(ResourceDefinitionContext c, String ns, String name,
      Decide decide, long timeoutMs) {
    long deadline = System.nanoTime() + timeoutMs * 1_000_000;
    while (true) {
      GenericKubernetesResource cur = get(c, ns, name);
      if (decide.done(cur)) {
        return cur;
      }
      java.util.concurrent.LinkedBlockingQueue<Object> q = new java.util.concurrent.LinkedBlockingQueue<>();
      Object closed = new Object();
      io.fabric8.kubernetes.client.Watch w;
      try {
        var op = client.genericKubernetesResources(c).inNamespace(ns).withName(name);
        io.fabric8.kubernetes.client.Watcher<GenericKubernetesResource> watcher =
            new io.fabric8.kubernetes.client.Watcher<>() {
              @Override
              public void eventReceived(Action action, GenericKubernetesResource resource) {
                q.add(action == Action.DELETED ? java.util.Optional.empty() : java.util.Optional.of(resource));
              }

              @Override
              public void onClose(io.fabric8.kubernetes.client.WatcherException cause) {
                q.add(closed);
              }
            };
        w = cur == null ? op.watch(watcher)
            : op.watch(new io.fabric8.kubernetes.api.model.ListOptionsBuilder()
                .withResourceVersion(cur.getMetadata().getResourceVersion()).build(), watcher);
      } catch (RuntimeException e) {
        throw map(e, c.getKind().toLowerCase(java.util.Locale.ROOT) + " " + ns + "/" + name);
      }
      try {
        while (true) {
          long left = deadline - System.nanoTime();
          if (left <= 0) {
            return null;
          }
          Object ev;
          try {
            ev = q.poll(left, java.util.concurrent.TimeUnit.NANOSECONDS);
          } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new AgentboxInterruptedException("interrupted while waiting for " + ns + "/" + name, e);
          }
          if (ev == null) {
            return null;
          }
          if (ev == closed) {
            break; // read again and watch again
          }
          java.util.Optional<GenericKubernetesResource> o = cast(ev);
          GenericKubernetesResource obj = o.orElse(null);
          if (decide.done(obj)) {
            return obj;
          }
        }
      } finally {
        w.close();
      }
    }
  }

  <T> T call(Supplier<T> f, ResourceDefinitionContext c, String ns, String name) {
    return call(f, c.getKind().toLowerCase(java.util.Locale.ROOT) + " " + ns + "/" + name);
  }

  /**
   * Runs one fabric8 call: refused at once when closed, and whatever fabric8 raises mapped to
   * this client's hierarchy ({@link #map}).
   */
  <T> T call(Supplier<T> f, String what) {
    ensureOpen();
    try {
      return f.get();
    } catch (RuntimeException e) {
      throw map(e, what);
    }
  }

  /**
   * Any failure of a fabric8 call as this client's: an {@link AgentboxException} as it is, a
   * closed client as {@link ClientClosedException}, an interrupt as {@link
   * AgentboxInterruptedException} (the flag set again), fabric8's own by its status code.
   */
  AgentboxException map(RuntimeException e, String what) {
    if (e instanceof AgentboxException a) {
      return a;
    }
    if (isClosed()) {
      return new ClientClosedException(what + ": the agentbox client is closed", e);
    }
    if (hasCause(e, InterruptedException.class) || Thread.currentThread().isInterrupted()) {
      Thread.currentThread().interrupt();
      return new AgentboxInterruptedException(what + ": interrupted", e);
    }
    if (e instanceof KubernetesClientException k) {
      return mapStatus(k, what);
    }
    if (e instanceof IllegalArgumentException || e instanceof NullPointerException) {
      // fabric8 refusing a name or body before sending it
      return new InvalidRequestException(what + ": " + e.getMessage(), e);
    }
    if (hasCause(e, IOException.class)) {
      return new TransportException(what + ": " + e.getMessage(), e);
    }
    return new ApiException(0, "", what + ": " + e, e);
  }

  static AgentboxException mapStatus(KubernetesClientException e, String what) {
    int code = e.getCode();
    String reason = e.getStatus() == null || e.getStatus().getReason() == null ? "" : e.getStatus().getReason();
    String message = e.getStatus() != null && e.getStatus().getMessage() != null
        ? e.getStatus().getMessage() : e.getMessage();
    if (code == 404) {
      return new NotFoundException(what + " not found", e);
    }
    if (code == 409) {
      return new ConflictException(reason, what + ": " + message, e);
    }
    if (code == 422) {
      return new InvalidSpecException(reason, what + ": " + message, e);
    }
    if (code == 0 || hasCause(e, IOException.class)) {
      return new TransportException(what + ": " + e.getMessage(), e);
    }
    return new ApiException(code, reason, what + ": " + message, e);
  }

  static boolean hasCause(Throwable t, Class<? extends Throwable> kind) {
    for (Throwable c = t.getCause(); c != null; c = c.getCause()) {
      if (kind.isInstance(c)) {
        return true;
      }
    }
    return false;
  }

  /** A fresh generic object. */
  static GenericKubernetesResource object(ResourceDefinitionContext c, Map<String, Object> meta,
      String field, Object value) {
    GenericKubernetesResource o = new GenericKubernetesResource();
    o.setApiVersion(apiVersion(c));
    o.setKind(c.getKind());
    io.fabric8.kubernetes.api.model.ObjectMeta m = new io.fabric8.kubernetes.api.model.ObjectMeta();
    m.setName((String) meta.get("name"));
    m.setGenerateName((String) meta.get("generateName"));
    m.setLabels(cast(meta.get("labels")));
    m.setAnnotations(cast(meta.get("annotations")));
    o.setMetadata(m);
    if (field != null) {
      o.setAdditionalProperty(field, value);
    }
    return o;
  }

  @SuppressWarnings("unchecked")
  static <T> T cast(Object o) {
    return (T) o;
  }

  /** A nested map field of a JSON object, or an empty map. */
  static Map<String, Object> obj(Object parent, String key) {
    if (parent instanceof Map<?, ?> m && m.get(key) instanceof Map<?, ?> child) {
      return cast(child);
    }
    return Map.of();
  }

  static String str(Object parent, String key) {
    if (parent instanceof Map<?, ?> m && m.get(key) != null) {
      return m.get(key).toString();
    }
    return null;
  }

  static Long num(Object parent, String key) {
    if (parent instanceof Map<?, ?> m && m.get(key) instanceof Number n) {
      return n.longValue();
    }
    return null;
  }
}
