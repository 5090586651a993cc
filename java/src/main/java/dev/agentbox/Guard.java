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
 *   <li><b>Fair hand-off</b>: a contender that finds the lease held queues in a one-place slot
 *       on the Lease ({@link #NEXT_ANNOTATION}, {@link #NEXT_RENEW_ANNOTATION}) and refreshes its
 *       claim while it waits; a free lease goes to the slot's owner while its claim is fresh. A
 *       release keeps the slot, so the releaser cannot take the guard again ahead of the
 *       contender queued behind it. Waiters learn of a release from a watch on the one Lease (a
 *       slow poll is the fallback). The slot is written only behind holders that expect it
 *       ({@link #FAIR_HOLDER_ANNOTATION}): they re-read on a 409 and renew again if the Lease is
 *       still theirs. A client unaware of the slot still excludes everyone; it only ignores the
 *       queue.
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
    /** Free, or the holder's time is up, and nobody else is queued: take it. */
    TAKE,
    /** Held, or another contender is queued for it: wait. */
    WAIT,
    /** Held, and the queue slot is empty, stale or this contender's: claim or refresh it. */
    QUEUE;

    /** The verdict's name in the vectors and the docs. */
    public String label() {
      return switch (this) {
        case TAKE -> "Take";
        case WAIT -> "Wait";
        case QUEUE -> "Queue";
      };
    }
  }

  /** Annotation on a guard Lease: the holder identity of the contender queued next. */
  public static final String NEXT_ANNOTATION = "agentbox.dev/guard-next";
  /** Annotation on a guard Lease: when the queued contender last claimed or refreshed its place. */
  public static final String NEXT_RENEW_ANNOTATION = "agentbox.dev/guard-next-renew";
  /**
   * Annotation on a guard Lease: the holder that took it knowing the queue slot; contenders write
   * the slot only while the Lease's holder is the one named here.
   */
  public static final String FAIR_HOLDER_ANNOTATION = "agentbox.dev/guard-fair-holder";
  /**
   * The longest a waiting contender goes without reading the Lease again while it watches it (a
   * third of the lease duration when that is shorter).
   */
  public static final long WATCH_FALLBACK_MS = 2_000;
  /**
   * The longest a holder whose hold was shared (its acquisition waited for another party, or it
   * created the Lease or took it from another holder) leaves a free Lease without a claim to
   * others after releasing it: the one that waited meanwhile may not have claimed the queue slot
   * yet (its claim races a short turn), and the releaser, wanting the guard again at once, would
   * take it first. The yield ends as soon as the Lease shows another party acting (a take or a
   * claim), so the bound only matters when nobody else wants the guard any more.
   */
  public static final long YIELD_MS = 1_000;

  /** When each holder of this process last released a Lease after a shared hold (nanos). */
  private static final java.util.concurrent.ConcurrentHashMap<String, Long> RELEASED =
      new java.util.concurrent.ConcurrentHashMap<>();

  private String releaseKey() {
    return namespace + "/" + leaseName + "\n" + cfg.holder();
  }

  private long yieldLeftMs() {
    Long at = RELEASED.get(releaseKey());
    return at == null ? 0 : Math.max(0, YIELD_MS - (System.nanoTime() - at) / 1_000_000);
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
   * Whether a contender outside the queue may take over a lease it just read (pure): {@code now}
   * is its wall clock; {@code unchangedForMs} how long it has seen the holder and renewTime
   * unchanged on its own monotonic clock.
   */
  public static Verdict judge(Map<String, Object> spec, Instant now, long unchangedForMs,
      long clockSkewMs, long defaultDurationMs) {
    return judge(spec, null, null, now, unchangedForMs, 0, clockSkewMs, defaultDurationMs);
  }

  private static long durationMs(Map<String, Object> spec, long defaultDurationMs) {
    Object d = spec == null ? null : spec.get("leaseDurationSeconds");
    return d instanceof Number n && n.longValue() > 0 ? n.longValue() * 1000 : defaultDurationMs;
  }

  private static boolean held(Map<String, Object> spec, Instant now, long unchangedForMs,
      long clockSkewMs, long durationMs) {
    if (spec == null) {
      return false;
    }
    Object holder = spec.get("holderIdentity");
    if (holder == null || holder.toString().isEmpty() || unchangedForMs >= durationMs) {
      return false;
    }
    Object renew = spec.get("renewTime");
    if (renew != null && !renew.toString().isEmpty()) {
      try {
        return parseTime(renew.toString()).plusMillis(durationMs + clockSkewMs).isAfter(now);
      } catch (IllegalArgumentException e) {
        return true;
      }
    }
    return true;
  }

  /**
   * The queue slot's owner if its claim is fresh (pure), else null: named, and neither its renew
   * time plus the duration plus the skew is past nor has it been unchanged for the duration. A
   * claim without a readable renew time is stale.
   */
  public static String freshSlot(Map<String, String> annotations, Instant now, long slotUnchangedForMs,
      long durationMs, long clockSkewMs) {
    if (annotations == null) {
      return null;
    }
    String owner = annotations.get(NEXT_ANNOTATION);
    String renew = annotations.get(NEXT_RENEW_ANNOTATION);
    if (owner == null || owner.isEmpty() || renew == null) {
      return null;
    }
    Instant until;
    try {
      until = parseTime(renew).plusMillis(durationMs + clockSkewMs);
    } catch (IllegalArgumentException e) {
      return null;
    }
    return until.isAfter(now) && slotUnchangedForMs < durationMs ? owner : null;
  }

  /**
   * What contender {@code me} may do with a lease it just read (pure; vectors: guard.judge).
   * With {@code me} null (outside the queue): TAKE when free or expired, else WAIT. Else a free
   * lease is TAKE unless another's claim on the slot is fresh (WAIT); a lease held by a holder
   * that expects the queue is QUEUE when the slot is empty, stale or {@code me}'s, else WAIT;
   * behind any other holder, WAIT. {@code unchangedForMs} is how long the holder and renewTime,
   * {@code slotUnchangedForMs} how long the queue slot, have been seen unchanged.
   */
  public static Verdict judge(Map<String, Object> spec, Map<String, String> annotations, String me,
      Instant now, long unchangedForMs, long slotUnchangedForMs, long clockSkewMs, long defaultDurationMs) {
    long duration = durationMs(spec, defaultDurationMs);
    boolean held = held(spec, now, unchangedForMs, clockSkewMs, duration);
    if (me == null) {
      return held ? Verdict.WAIT : Verdict.TAKE;
    }
    String slot = freshSlot(annotations, now, slotUnchangedForMs, duration, clockSkewMs);
    boolean othersQueued = slot != null && !slot.equals(me);
    if (!held) {
      return othersQueued ? Verdict.WAIT : Verdict.TAKE;
    }
    String fair = annotations == null ? null : annotations.get(FAIR_HOLDER_ANNOTATION);
    boolean expects = fair != null && fair.equals(String.valueOf(spec.get("holderIdentity")));
    return expects && !othersQueued ? Verdict.QUEUE : Verdict.WAIT;
  }

  /** The annotations written when taking a lease (pure): the slot cleared, the taker named. */
  public static Map<String, String> takenAnnotations(Map<String, String> old, String me) {
    Map<String, String> a = old == null ? new LinkedHashMap<>() : new LinkedHashMap<>(old);
    a.remove(NEXT_ANNOTATION);
    a.remove(NEXT_RENEW_ANNOTATION);
    a.put(FAIR_HOLDER_ANNOTATION, me);
    return a;
  }

  /** The annotations written when claiming or refreshing the queue slot at {@code now} (pure). */
  public static Map<String, String> claimedAnnotations(Map<String, String> old, String me, Instant now) {
    Map<String, String> a = old == null ? new LinkedHashMap<>() : new LinkedHashMap<>(old);
    a.put(NEXT_ANNOTATION, me);
    a.put(NEXT_RENEW_ANNOTATION, microTime(now));
    return a;
  }

  /**
   * The annotations written by a contender that gives up waiting (pure): the slot cleared if it
   * is still {@code me}'s; null when it is not (nothing to write).
   */
  public static Map<String, String> withdrawnAnnotations(Map<String, String> old, String me) {
    if (old == null || !me.equals(old.get(NEXT_ANNOTATION))) {
      return null;
    }
    Map<String, String> a = new LinkedHashMap<>(old);
    a.remove(NEXT_ANNOTATION);
    a.remove(NEXT_RENEW_ANNOTATION);
    return a;
  }

  /**
   * Whether a hold makes its holder yield after releasing it (pure): its acquisition had to wait
   * for another party (waiting out its own yield does not count), or the Lease it took ({@code
   * before}: its annotations as taken, null when it created the Lease) did not name {@code me} as
   * its last fair holder. A contender outside the queue never yields.
   */
  public static boolean sharedHold(boolean queue, boolean waited, Map<String, String> before, String me) {
    return queue && (waited || before == null || !me.equals(before.get(FAIR_HOLDER_ANNOTATION)));
  }

  /**
   * How much longer (ms) a contender whose verdict is Take leaves the free Lease to others (pure):
   * {@code yieldLeftMs} (YIELD_MS less the time since its last release of a shared hold) if the
   * Lease still names {@code me} as its last fair holder and the queue slot is not {@code me}'s,
   * else 0. Only the last holder yields, so two harnesses that both released recently never both
   * stand back.
   */
  public static long yieldFor(Map<String, String> annotations, String me, long yieldLeftMs) {
    Map<String, String> a = annotations == null ? Map.of() : annotations;
    if (me.equals(a.get(NEXT_ANNOTATION)) || !me.equals(a.get(FAIR_HOLDER_ANNOTATION))) {
      return 0;
    }
    return yieldLeftMs;
  }

  /**
   * The spec written when releasing (pure): no holder and no times; the duration and the fencing
   * token kept. The annotations (the queue slot) are kept as they are.
   */
  public static Map<String, Object> releasedSpec(Map<String, Object> spec) {
    Map<String, Object> s = spec == null ? new LinkedHashMap<>() : new LinkedHashMap<>(spec);
    s.remove("holderIdentity");
    s.remove("acquireTime");
    s.remove("renewTime");
    return s;
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
  /**
   * A shared hold (its acquisition waited, or it created the Lease or took it from another
   * holder): on release, yield the next turn (see YIELD_MS).
   */
  private volatile boolean contended;
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

  /**
   * Takes the lease (waiting up to the guard's wait; null waits indefinitely) and renews it.
   * While it waits it holds the Lease's queue slot when it can and watches the Lease for a
   * release.
   */
  public Guard acquire() {
    synchronized (lock) {
      if (lease != null || released) {
        throw new GuardException("guard already acquired");
      }
    }
    long start = System.nanoTime();
    Long deadline = waitMs == null ? null : start + waitMs * 1_000_000;
    try (Waiter w = new Waiter()) {
      while (true) {
        long attempt = System.nanoTime();
        boolean mayQueue = deadline == null || attempt < deadline;
        Step step = null;
        try {
          step = w.step(mayQueue);
        } catch (AgentboxException e) {
          if (!retryable(e) || (deadline != null && System.nanoTime() >= deadline)) {
            throw e;
          }
        }
        if (step != null && step.took() != null) {
          w.claimedAt = null;
          contended = sharedHold(true, w.waited, w.tookFrom, cfg.holder());
          start(step.took(), attempt);
          return this;
        }
        // Waiting out its own yield is not contention: a harness whose partner left would
        // otherwise yield again after every turn.
        if (step == null || step.again() || w.yieldUntil == null) {
          w.waited = true;
        }
        if (step != null && step.again()) {
          // Lost a race: read the Lease itself at once. What the watch delivered so far may be
          // what the 409 was about (the watch trails the API server).
          w.latest.set(null);
          continue;
        }
        long pause;
        if (step == null || !w.watchFrom(step.rv())) {
          pause = (long) (cfg.retryIntervalMs() * (0.5 + ThreadLocalRandom.current().nextDouble()));
        } else {
          pause = Math.min(WATCH_FALLBACK_MS, cfg.renewEveryMs());
          if (w.yieldUntil != null) {
            pause = Math.min(pause, Math.max(0, (w.yieldUntil - System.nanoTime()) / 1_000_000));
            w.yieldUntil = null;
          }
          if (w.claimedAt != null) {
            long due = w.claimedAt + refreshEveryMs(cfg, step.durationMs()) * 1_000_000;
            pause = Math.min(pause, Math.max(0, (due - System.nanoTime()) / 1_000_000));
          }
        }
        if (deadline != null) {
          long now = System.nanoTime();
          if (now >= deadline) {
            throw new GuardTimeoutException(leaseName, w.lastHolder);
          }
          pause = Math.min(pause, (deadline - now) / 1_000_000 + 1);
        }
        try {
          if (w.wake.poll(pause, TimeUnit.MILLISECONDS) != null) {
            w.wake.clear();
          }
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          throw new AgentboxInterruptedException("interrupted while waiting for lease " + leaseName, e);
        }
      }
    }
  }

  private static boolean retryable(AgentboxException e) {
    if (e instanceof TransportException) {
      return true;
    }
    return e instanceof ApiException a && (a.status() >= 500 || a.status() == 409 || a.status() == 429);
  }

  /** The queue claim's refresh period: a third of the shorter of the two durations. */
  private static long refreshEveryMs(GuardConfig cfg, long leaseDurationMs) {
    return Math.min(cfg.durationSecs() * 1000L, leaseDurationMs) / 3;
  }

  /**
   * Still held by {@code holder} with fencing token {@code token} (whatever else changed: a
   * contender's claim on the queue slot changes the resourceVersion only).
   */
  private static boolean stillOurs(GenericKubernetesResource l, String holder, int token) {
    if (l == null) {
      return false;
    }
    Map<String, Object> spec = Kube.cast(l.getAdditionalProperties().get("spec"));
    Long t = Kube.num(spec, "leaseTransitions");
    return holder.equals(Kube.str(spec, "holderIdentity")) && (t == null ? 0 : t.intValue()) == token;
  }

  private static Map<String, String> annotationsOf(GenericKubernetesResource l) {
    Map<String, String> a = l.getMetadata().getAnnotations();
    return a == null ? new LinkedHashMap<>() : new LinkedHashMap<>(a);
  }

  /** What one attempt came to: the lease taken, read again at once, or wait from {@code rv}. */
  private record Step(GenericKubernetesResource took, boolean again, String rv, long durationMs) {}

  /** A contender's state while it waits for the Lease. */
  private final class Waiter implements AutoCloseable {
    private String holderKey;
    private long holderSince;
    private String slotKey;
    private long slotSince;
    String lastHolder = "";
    /** Whether this acquisition had to wait for another party (the guard is contended). */
    boolean waited;
    /** The annotations of the Lease it took (null: it created it), for sharedHold. */
    Map<String, String> tookFrom;
    /** Until when (nanos) this contender yields a free Lease to others (see YIELD_MS). */
    Long yieldUntil;
    /** When this contender last wrote its claim on the slot (nanos); null: it holds none. */
    Long claimedAt;
    final java.util.concurrent.LinkedBlockingQueue<Object> wake = new java.util.concurrent.LinkedBlockingQueue<>();
    private io.fabric8.kubernetes.client.Watch watch;
    private volatile boolean watchClosed;
    /**
     * The Lease as the watch last delivered it, not yet judged: read instead of a GET (a waiter
     * that reacts one request sooner claims the slot before a short turn ends).
     */
    final java.util.concurrent.atomic.AtomicReference<GenericKubernetesResource> latest =
        new java.util.concurrent.atomic.AtomicReference<>();
    private long watchOpened;

    private long unchanged(boolean holder, String key, long now) {
      if (holder) {
        if (!key.equals(holderKey)) {
          holderKey = key;
          holderSince = now;
        }
        return (now - holderSince) / 1_000_000;
      }
      if (!key.equals(slotKey)) {
        slotKey = key;
        slotSince = now;
      }
      return (now - slotSince) / 1_000_000;
    }

    Step step(boolean mayQueue) {
      String me = cfg.holder();
      Instant now = Instant.now();
      GenericKubernetesResource current = latest.getAndSet(null);
      if (current == null) {
        current = kube.get(Kube.LEASES, namespace, leaseName);
      }
      if (current == null) {
        Map<String, Object> meta = new LinkedHashMap<>();
        meta.put("name", leaseName);
        meta.put("labels", labels.isEmpty() ? null : new LinkedHashMap<>(labels));
        meta.put("annotations", takenAnnotations(null, me));
        GenericKubernetesResource body = Kube.object(Kube.LEASES, meta, "spec", takenSpec(null, cfg, now));
        tookFrom = null;
        try {
          return new Step(kube.create(Kube.LEASES, namespace, body), false, null, 0);
        } catch (ConflictException e) {
          return new Step(null, true, null, 0);
        }
      }
      String rv = current.getMetadata().getResourceVersion();
      Map<String, Object> spec = Kube.cast(current.getAdditionalProperties().get("spec"));
      Map<String, String> ann = annotationsOf(current);
      String holder = Kube.str(spec, "holderIdentity");
      lastHolder = holder == null ? "" : holder;
      long mono = System.nanoTime();
      String renew = Kube.str(spec, "renewTime");
      long unchanged = unchanged(true, lastHolder + "\n" + (renew == null ? "" : renew), mono);
      long slotUnchanged = unchanged(false, ann.getOrDefault(NEXT_ANNOTATION, "") + "\n"
          + ann.getOrDefault(NEXT_RENEW_ANNOTATION, ""), mono);
      Verdict v = judge(spec, ann, me, now, unchanged, slotUnchanged, cfg.clockSkewMs(), cfg.leaseDurationMs());
      long duration = durationMs(spec, cfg.leaseDurationMs());
      if (!me.equals(ann.get(NEXT_ANNOTATION))) {
        claimedAt = null;
      }
      Step wait = new Step(null, false, rv, duration);
      if (v == Verdict.WAIT) {
        return wait;
      }
      if (v == Verdict.QUEUE) {
        boolean due = claimedAt == null
            || System.nanoTime() - claimedAt >= refreshEveryMs(cfg, duration) * 1_000_000;
        if (!mayQueue || !due) {
          return wait;
        }
        long at = System.nanoTime();
        current.getMetadata().setAnnotations(claimedAnnotations(ann, me, Instant.now()));
        try {
          // Conditioned on the resourceVersion read: a 409 means the Lease changed.
          GenericKubernetesResource fresh = kube.update(Kube.LEASES, namespace, current);
          claimedAt = at;
          return new Step(null, false, fresh.getMetadata().getResourceVersion(), duration);
        } catch (ConflictException e) {
          return new Step(null, true, null, 0);
        }
      }
      long grace = yieldFor(ann, me, yieldLeftMs());
      if (grace > 0) {
        // Just released after a shared hold: give whoever waited for it the time to claim the
        // slot or take it (ended early by a watch event showing it act).
        yieldUntil = System.nanoTime() + grace * 1_000_000;
        return wait;
      }
      tookFrom = ann == null ? new LinkedHashMap<>() : new LinkedHashMap<>(ann);
      current.setAdditionalProperty("spec", takenSpec(spec, cfg, now));
      current.getMetadata().setAnnotations(takenAnnotations(ann, me));
      if (!labels.isEmpty()) {
        Map<String, String> l = current.getMetadata().getLabels() == null
            ? new LinkedHashMap<>() : new LinkedHashMap<>(current.getMetadata().getLabels());
        l.putAll(labels);
        current.getMetadata().setLabels(l);
      }
      try {
        // The body carries metadata.resourceVersion: a 409 if anyone wrote the lease since.
        return new Step(kube.update(Kube.LEASES, namespace, current), false, null, 0);
      } catch (ConflictException e) {
        return new Step(null, true, null, 0);
      }
    }

    /**
     * Watches the Lease from {@code rv} (opened once, and again when the server closed it): every
     * event wakes the waiter. False when it cannot be watched (no permission, no API server):
     * the waiter polls then.
     */
    boolean watchFrom(String rv) {
      if (watch != null && !watchClosed) {
        return true;
      }
      if (watch != null) {
        watch.close();
        watch = null;
        if (System.nanoTime() - watchOpened < 1_000_000_000L) {
          return false; // closed as soon as opened (refused): poll this time
        }
      }
      watchClosed = false;
      watchOpened = System.nanoTime();
      try {
        watch = kube.client.genericKubernetesResources(Kube.LEASES).inNamespace(namespace).withName(leaseName)
            .watch(new io.fabric8.kubernetes.api.model.ListOptionsBuilder().withResourceVersion(rv).build(),
                new io.fabric8.kubernetes.client.Watcher<GenericKubernetesResource>() {
                  @Override
                  public void eventReceived(Action action, GenericKubernetesResource resource) {
                    latest.set(action == Action.ADDED || action == Action.MODIFIED ? resource : null);
                    wake.add(action);
                  }

                  @Override
                  public void onClose(io.fabric8.kubernetes.client.WatcherException cause) {
                    watchClosed = true;
                    wake.add(Boolean.TRUE);
                  }
                });
        return true;
      } catch (io.fabric8.kubernetes.client.KubernetesClientException e) {
        return false;
      }
    }

    /**
     * Stops watching and gives up the queue slot if this contender holds it (best effort: a claim
     * left behind goes stale within a lease duration anyway).
     */
    @Override
    public void close() {
      if (watch != null) {
        watch.close();
      }
      if (claimedAt == null) {
        return;
      }
      claimedAt = null;
      try {
        for (int i = 0; i < 3; i++) {
          GenericKubernetesResource cur = kube.get(Kube.LEASES, namespace, leaseName);
          if (cur == null) {
            return;
          }
          Map<String, String> a = withdrawnAnnotations(annotationsOf(cur), cfg.holder());
          if (a == null) {
            return;
          }
          cur.getMetadata().setAnnotations(a);
          try {
            kube.update(Kube.LEASES, namespace, cur);
            return;
          } catch (ConflictException e) {
            // read again
          }
        }
      } catch (AgentboxException e) {
        // best effort
      }
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
    } catch (ConflictException e) {
      // Someone wrote the Lease: a contender's claim on the queue slot leaves it ours (renew the
      // fresh copy at once); anything else means it was taken.
      GenericKubernetesResource cur;
      try {
        cur = kube.get(Kube.LEASES, namespace, leaseName);
      } catch (AgentboxException again) {
        scheduleRenewal(lastOk, System.nanoTime() + cfg.renewEveryMs() * 1_000_000 / 4);
        return;
      }
      if (!stillOurs(cur, cfg.holder(), fencingToken())) {
        setLost();
        return;
      }
      synchronized (lock) {
        lease = cur;
      }
      scheduleRenewal(lastOk, System.nanoTime());
    } catch (NotFoundException e) {
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
    for (int i = 0; i < 5; i++) {
      GenericKubernetesResource body = new GenericKubernetesResource();
      body.setApiVersion(last.getApiVersion());
      body.setKind(last.getKind());
      body.setMetadata(last.getMetadata());
      body.setAdditionalProperty("spec", releasedSpec(Kube.obj(last.getAdditionalProperties(), "spec")));
      try {
        kube.update(Kube.LEASES, namespace, body);
        if (contended) {
          RELEASED.put(releaseKey(), System.nanoTime());
        }
        return;
      } catch (NotFoundException e) {
        throw new GuardLostException(leaseName);
      } catch (ConflictException e) {
        // A queued contender's claim changed the resourceVersion: release the fresh copy if it
        // is still ours. The slot is kept.
        last = kube.get(Kube.LEASES, namespace, leaseName);
        if (!stillOurs(last, cfg.holder(), fencingToken())) {
          throw new GuardLostException(leaseName);
        }
      }
    }
    throw new GuardLostException(leaseName);
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
