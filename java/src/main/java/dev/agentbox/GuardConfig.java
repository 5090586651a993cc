package dev.agentbox;

import java.net.InetAddress;
import java.util.HexFormat;

/**
 * Settings of a scope guard (milliseconds), the Rust crate's defaults: a 15 s lease renewed every
 * third of it, polled every 200 ms (jittered) while held elsewhere, with 2 s of clock skew
 * allowed when judging expiry.
 */
public record GuardConfig(
    long leaseDurationMs, Long renewIntervalMs, long retryIntervalMs, long clockSkewMs, String holder) {

  public static final long DEFAULT_LEASE_DURATION_MS = 15_000;
  public static final long DEFAULT_RETRY_INTERVAL_MS = 200;
  public static final long DEFAULT_CLOCK_SKEW_MS = 2_000;

  /** The defaults, with a fresh holder identity. */
  public static GuardConfig defaults() {
    return withLeaseDuration(DEFAULT_LEASE_DURATION_MS);
  }

  /** The defaults with another lease duration. */
  public static GuardConfig withLeaseDuration(long ms) {
    return new GuardConfig(ms, null, DEFAULT_RETRY_INTERVAL_MS, DEFAULT_CLOCK_SKEW_MS, holderIdentity());
  }

  /** The same settings with another holder identity. */
  public GuardConfig withHolder(String h) {
    return new GuardConfig(leaseDurationMs, renewIntervalMs, retryIntervalMs, clockSkewMs, h);
  }

  /** {@code leaseDurationSeconds}: whole seconds, at least 1. */
  public int durationSecs() {
    return (int) Math.max(leaseDurationMs / 1000, 1);
  }

  /** The renewal period: a third of the lease duration unless set. */
  public long renewEveryMs() {
    return renewIntervalMs != null ? renewIntervalMs : durationSecs() * 1000L / 3;
  }

  /**
   * How long after the start of the last successful renewal the lease is still trusted: the
   * duration less a margin, since others may take over right at the duration.
   */
  public long trustWindowMs() {
    long d = durationSecs() * 1000L;
    long margin = Math.min(Math.max(d / 5, 500), d / 2);
    return d - margin;
  }

  /** A holder identity, {@code hostname/pid/random}, as the Rust and Python clients make it. */
  public static String holderIdentity() {
    String host = System.getenv("HOSTNAME");
    if (host == null || host.isEmpty()) {
      try {
        host = InetAddress.getLocalHost().getHostName();
      } catch (java.io.IOException e) {
        host = "unknown";
      }
    }
    byte[] b = new byte[4];
    new java.security.SecureRandom().nextBytes(b);
    return host + "/" + ProcessHandle.current().pid() + "/" + HexFormat.of().formatHex(b);
  }
}
