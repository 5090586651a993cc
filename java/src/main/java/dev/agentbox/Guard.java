package dev.agentbox;

import io.fabric8.kubernetes.api.model.GenericKubernetesResource;
import java.time.Instant;
import java.time.LocalDateTime;
import java.time.ZoneOffset;
import java.time.format.DateTimeFormatter;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The execution guard of one scope: one {@code coordination.k8s.io/v1} Lease per scope key, the
 * Rust crate's protocol (checked against its vectors), so Java, Python and Rust holders (the
 * {@code agentbox lock} CLI, harnesses) and the operator's snapshots exclude each other.
 *
 * <ul>
 *   <li><b>Acquire</b> waits up to a deadline: create the Lease, or take over a free or expired
 *       one with an update conditioned on its resourceVersion; a 409 means someone else won.
 *   <li><b>Fencing token</b>: every acquisition bumps {@code leaseTransitions}.
 *   <li><b>Renew</b> in the background every third of the duration with conditioned updates; a
 *       409 or 404, or no renewal for long enough that another could take over, loses it:
 *       {@link #run} interrupts the guarded work and raises {@link GuardLostException}.
 *   <li><b>Release</b> clears the holder with a conditioned update and keeps the Lease, so
 *       fencing tokens stay monotonic. {@link #close()} releases and never throws.
 * </ul>
 */
public final class Guard implements AutoCloseable {
  private static final int I32_MAX = Integer.MAX_VALUE;
  private static final DateTimeFormatter MICRO =
      DateTimeFormatter.ofPattern("uuuu-MM-dd'T'HH:mm:ss.SSSSSS'Z'").withZone(ZoneOffset.UTC);
  private static final Pattern TIME =
      Pattern.compile("(\\d{4}-\\d{2}-\\d{2}T\\d{2}:\\d{2}:\\d{2})(?:\\.(\\d+))?(Z|[+-]\\d{2}:\\d{2})");

  /** A contender's verdict on a Lease it just read. */
  public enum Verdict {
    TAKE, WAIT
  }

  // ---- the pure rules (vectors: guard.judge, guard.taken_spec, guard.timings) ----

  /** A Kubernetes MicroTime as the API server writes it. */
  public static String microTime(Instant t) {
    return MICRO.format(t);
  }

  /** Parses a Kubernetes Time/MicroTime (RFC 3339, any fraction digits). */
  public static Instant parseTime(String s) {
    Matcher m = TIME.matcher(s.strip());
    if (!m.matches()) {
      throw new IllegalArgumentException("not an RFC 3339 time: " + s);
    }
    String frac = m.group(2) == null ? "0" : m.group(2);
    String micros = (frac.length() > 6 ? frac.substring(0, 6) : frac + "000000".substring(frac.length()));
    LocalDateTime base = LocalDateTime.parse(m.group(1)).withNano(Integer.parseInt(micros) * 1000);
    ZoneOffset off = m.group(3).equals("Z") ? ZoneOffset.UTC : ZoneOffset.of(m.group(3));
    return base.toInstant(off);
  }

  /**
   * Whether a contender may take over a lease it just read (pure). {@code now} is its wall
   * clock; {@code unchangedForMs} how long it has seen the current resourceVersion on its own
   * monotonic clock.
   */
  public static Verdict judge(Map<String, Object> spec, Instant now, long unchangedForMs,
      long clockSkewMs, long defaultDurationMs) {
    if (spec == null) {
      return Verdict.TAKE;
    }
    Object holder = spec.get("holderIdentity");
    if (holder == null || holder.toString().isEmpty()) {
      return Verdict.TAKE;
    }
    Object d = spec.get("leaseDurationSeconds");
    long durationMs = d instanceof Number n && n.longValue() > 0 ? n.longValue() * 1000 : defaultDurationMs;
    if (unchangedForMs >= durationMs) {
      return Verdict.TAKE;
    }
    Object renew = spec.get("renewTime");
    if (renew != null && !renew.toString().isEmpty()) {
      Instant expiry;
      try {
        expiry = parseTime(renew.toString()).plusMillis(durationMs + clockSkewMs);
      } catch (IllegalArgumentException e) {
        return Verdict.WAIT;
      }
      if (!expiry.isAfter(now)) {
        return Verdict.TAKE;
      }
    }
    return Verdict.WAIT;
  }

  /** The spec written when taking a lease: this holder, times now, transitions bumped. */
  public static Map<String, Object> takenSpec(Map<String, Object> old, GuardConfig cfg, Instant now) {
    long transitions = 0;
    if (old != null && old.get("leaseTransitions") instanceof Number n) {
      transitions = n.longValue();
    }
    String t = microTime(now);
    Map<String, Object> s = new LinkedHashMap<>();
    s.put("acquireTime", t);
    s.put("holderIdentity", cfg.holder());
    s.put("leaseDurationSeconds", cfg.durationSecs());
    s.put("leaseTransitions", (int) Math.min(transitions + 1, I32_MAX));
    s.put("renewTime", t);
    return s;
  }

  // ---- the running guard ----

  private final Kube kube;
  private final String namespace;
  private final String leaseName;
  private final Map<String, String> labels;
  private final GuardConfig cfg;
  private final Long waitMs;
  private final Object lock = new Object();
  private final CompletableFuture<Void> lost = new CompletableFuture<>();
  private volatile boolean wasLost;
  private GenericKubernetesResource lease;
  private ScheduledExecutorService renewer;
  private boolean released;
  private boolean stopping;
  private int fencingToken;
  private Instant acquiredAt;

  Guard(Kube kube, String namespace, String leaseName, Map<String, String> labels, GuardConfig cfg, Long waitMs) {
    this.kube = kube;
    this.namespace = namespace;
    this.leaseName = leaseName;
    this.labels = Map.copyOf(labels);
    this.cfg = cfg;
    this.waitMs = waitMs;
  }

  public String leaseName() {
    return leaseName;
  }

  public String holder() {
    return cfg.holder();
  }

  /** The fencing token: {@code leaseTransitions} after this acquisition; 0 until acquired. */
  public int fencingToken() {
    synchronized (lock) {
      return fencingToken;
    }
  }

  /** When the lease was acquired ({@code acquireTime}), or null. */
  public Instant acquiredAt() {
    synchronized (lock) {
      return acquiredAt;
    }
  }

  /** Whether the guard has been lost. */
  public boolean isLost() {
    return wasLost;
  }

  public boolean isReleased() {
    synchronized (lock) {
      return released;
    }
  }

  /** Acquired, not released and not lost. */
  public boolean isHeld() {
    synchronized (lock) {
      return lease != null && !released && !lost.isDone();
    }
  }

  /** Completes when the guard is lost, or released (it is no longer ours to use then). */
  public CompletableFuture<Void> whenLost() {
    return lost.copy();
  }

  /** Raises {@link GuardLostException} if the guard was lost. */
  public void check() {
    if (isLost()) {
      throw new GuardLostException(leaseName);
    }
  }

  /** Takes the lease (waiting up to the guard's wait; null waits indefinitely) and renews it. */
  public Guard acquire() {
    synchronized (lock) {
      if (lease != null || released) {
        throw new GuardException("guard already acquired");
      }
    }
    long start = System.nanoTime();
    Long deadline = waitMs == null ? null : start + waitMs * 1_000_000;
    String[] seenRv = {null};
    long[] seenSince = {0};
    String[] lastHolder = {""};
    while (true) {
      long attempt = System.nanoTime();
      GenericKubernetesResource got = null;
      try {
        got = tryTake(seenRv, seenSince, lastHolder);
      } catch (AgentboxException e) {
        if (!retryable(e) || (deadline != null && System.nanoTime() >= deadline)) {
          throw e;
        }
      }
      if (got != null) {
        start(got, attempt);
        return this;
      }
      long pause = (long) (cfg.retryIntervalMs() * (0.5 + ThreadLocalRandom.current().nextDouble()));
      if (deadline != null) {
        long now = System.nanoTime();
        if (now >= deadline) {
          throw new GuardTimeoutException(leaseName, lastHolder[0]);
        }
        pause = Math.min(pause, (deadline - now) / 1_000_000 + 1);
      }
      try {
        Thread.sleep(pause);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new AgentboxInterruptedException("interrupted while waiting for lease " + leaseName, e);
      }
    }
  }

  private static boolean retryable(AgentboxException e) {
    if (e instanceof TransportException) {
      return true;
    }
    return e instanceof ApiException a && (a.status() >= 500 || a.status() == 409 || a.status() == 429);
  }

  private GenericKubernetesResource tryTake(String[] seenRv, long[] seenSince, String[] lastHolder) {
    Instant now = Instant.now();
    GenericKubernetesResource current = kube.get(Kube.LEASES, namespace, leaseName);
    if (current == null) {
      Map<String, Object> meta = new LinkedHashMap<>();
      meta.put("name", leaseName);
      meta.put("labels", labels.isEmpty() ? null : new LinkedHashMap<>(labels));
      GenericKubernetesResource body = Kube.object(Kube.LEASES, meta, "spec", takenSpec(null, cfg, now));
      try {
        return kube.create(Kube.LEASES, namespace, body);
      } catch (ConflictException e) {
        return null;
      }
    }
    String rv = current.getMetadata().getResourceVersion();
    if (!java.util.Objects.equals(seenRv[0], rv)) {
      seenRv[0] = rv;
      seenSince[0] = System.nanoTime();
    }
    Map<String, Object> spec = Kube.cast(current.getAdditionalProperties().get("spec"));
    lastHolder[0] = spec == null || spec.get("holderIdentity") == null ? "" : spec.get("holderIdentity").toString();
    long unchanged = (System.nanoTime() - seenSince[0]) / 1_000_000;
    if (judge(spec, now, unchanged, cfg.clockSkewMs(), cfg.leaseDurationMs()) == Verdict.WAIT) {
      return null;
    }
    current.setAdditionalProperty("spec", takenSpec(spec, cfg, now));
    if (!labels.isEmpty()) {
      Map<String, String> l = current.getMetadata().getLabels() == null
          ? new LinkedHashMap<>() : new LinkedHashMap<>(current.getMetadata().getLabels());
      l.putAll(labels);
      current.getMetadata().setLabels(l);
    }
    try {
      // The body carries metadata.resourceVersion: a 409 if anyone wrote the lease since.
      return kube.update(Kube.LEASES, namespace, current);
    } catch (ConflictException e) {
      return null;
    }
  }

  private void start(GenericKubernetesResource l, long sentNanos) {
    Map<String, Object> spec = Kube.cast(l.getAdditionalProperties().get("spec"));
    synchronized (lock) {
      lease = l;
      Long t = Kube.num(spec, "leaseTransitions");
      fencingToken = t == null ? 0 : t.intValue();
      String at = Kube.str(spec, "acquireTime");
      acquiredAt = at == null ? null : parseTime(at);
      ScheduledThreadPoolExecutor ex = new ScheduledThreadPoolExecutor(1, r -> {
        Thread th = new Thread(r, "agentbox-guard-" + leaseName);
        th.setDaemon(true);
        return th;
      });
      // A release drops the next scheduled renewal instead of waiting for it; one in flight
      // still finishes (see release()).
      ex.setExecuteExistingDelayedTasksAfterShutdownPolicy(false);
      renewer = ex;
    }
    scheduleRenewal(sentNanos, sentNanos + cfg.renewEveryMs() * 1_000_000);
  }

  private void scheduleRenewal(long lastOk, long next) {
    long trustedUntil = lastOk + cfg.trustWindowMs() * 1_000_000;
    long at = Math.min(next, trustedUntil);
    long delay = Math.max(0, at - System.nanoTime());
    synchronized (lock) {
      if (stopping || renewer == null) {
        return;
      }
      renewer.schedule(() -> renew(lastOk), delay, TimeUnit.NANOSECONDS);
    }
  }

  private void renew(long lastOk) {
    long trustedUntil = lastOk + cfg.trustWindowMs() * 1_000_000;
    GenericKubernetesResource body;
    synchronized (lock) {
      if (stopping) {
        return;
      }
      body = copyWithRenewTime(lease);
    }
    if (System.nanoTime() >= trustedUntil) {
      setLost(); // not renewed in time
      return;
    }
    long attempt = System.nanoTime();
    try {
      GenericKubernetesResource fresh = kube.update(Kube.LEASES, namespace, body);
      if (System.nanoTime() >= trustedUntil) {
        setLost();
        return;
      }
      synchronized (lock) {
        lease = fresh;
      }
      scheduleRenewal(attempt, attempt + cfg.renewEveryMs() * 1_000_000);
    } catch (ConflictException | NotFoundException e) {
      setLost();
    } catch (AgentboxException e) {
      // A failed renewal is retried sooner; the trust window still bounds how long.
      scheduleRenewal(lastOk, System.nanoTime() + cfg.renewEveryMs() * 1_000_000 / 4);
    }
  }

  private static GenericKubernetesResource copyWithRenewTime(GenericKubernetesResource l) {
    GenericKubernetesResource b = new GenericKubernetesResource();
    b.setApiVersion(l.getApiVersion());
    b.setKind(l.getKind());
    b.setMetadata(l.getMetadata());
    Map<String, Object> spec = new LinkedHashMap<>(Kube.obj(l.getAdditionalProperties(), "spec"));
    spec.put("renewTime", microTime(Instant.now()));
    b.setAdditionalProperty("spec", spec);
    return b;
  }

  private final java.util.List<Thread> guarded = new java.util.concurrent.CopyOnWriteArrayList<>();

  private void setLost() {
    synchronized (lock) {
      if (released) {
        return; // a release in progress: not a loss
      }
      wasLost = true;
    }
    if (lost.complete(null)) {
      for (Thread t : guarded) {
        t.interrupt();
      }
    }
  }

  /**
   * Runs {@code work} in this thread while the guard is held (acquiring it first if needed);
   * if the guard is lost meanwhile the thread is interrupted and {@link GuardLostException}
   * raised. The guard stays acquired afterwards (close it to release).
   */
  public <T> T run(java.util.concurrent.Callable<T> work) throws Exception {
    if (!isHeld() && !isReleased() && !wasLost) {
      acquire();
    }
    check();
    Thread me = Thread.currentThread();
    guarded.add(me);
    try {
      T out = work.call();
      check();
      return out;
    } catch (Exception e) {
      if (isLost()) {
        GuardLostException g = new GuardLostException(leaseName);
        g.addSuppressed(e);
        throw g;
      }
      throw e;
    } finally {
      guarded.remove(me);
      if (isLost()) {
        Thread.interrupted(); // the interrupt was ours; the exception says why
      }
    }
  }

  /**
   * Stops renewing and clears the holder with an update conditioned on the last
   * resourceVersion. Raises {@link GuardLostException} if the guard had been lost or someone
   * wrote the lease in between. Idempotent.
   */
  public void release() {
    GenericKubernetesResource last;
    ScheduledExecutorService r;
    synchronized (lock) {
      if (released) {
        return;
      }
      released = true;
      stopping = true;
      r = renewer;
    }
    if (r != null) {
      // Lets a renewal in flight finish: one the API server applied but whose answer was
      // dropped would leave a stale resourceVersion, and this release would then fail.
      r.shutdown();
      try {
        r.awaitTermination(30, TimeUnit.SECONDS);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
    }
    boolean lostBefore = wasLost;
    lost.complete(null);
    synchronized (lock) {
      last = lease;
    }
    if (lostBefore) {
      throw new GuardLostException(leaseName);
    }
    if (last == null) {
      return;
    }
    GenericKubernetesResource body = new GenericKubernetesResource();
    body.setApiVersion(last.getApiVersion());
    body.setKind(last.getKind());
    body.setMetadata(last.getMetadata());
    Map<String, Object> spec = new LinkedHashMap<>(Kube.obj(last.getAdditionalProperties(), "spec"));
    spec.remove("holderIdentity");
    spec.remove("acquireTime");
    spec.remove("renewTime");
    body.setAdditionalProperty("spec", spec);
    try {
      kube.update(Kube.LEASES, namespace, body);
    } catch (ConflictException | NotFoundException e) {
      throw new GuardLostException(leaseName);
    }
  }

  /** Releases; never throws (a lost guard or an unreachable API server is simply let go). */
  @Override
  public void close() {
    try {
      release();
    } catch (RuntimeException e) {
      // close() must not throw: the lease expires on its own if the update did not land.
    }
  }
}
