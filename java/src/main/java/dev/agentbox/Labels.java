package dev.agentbox;

import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.regex.Pattern;

/**
 * Scope keys, label and annotation keys, and the names agentbox derives for its objects: the
 * Rust crate's {@code agentbox_api::labels}, checked against its vectors, so a Sandbox or Lease
 * named here is the one the operator, the CLI, Rust and Python harnesses use for the scope.
 */
public final class Labels {
  private Labels() {}

  /** Label: scope kind. */
  public static final String SCOPE = "agentbox.dev/scope";
  /** Label: the scope key. */
  public static final String SCOPE_KEY = "agentbox.dev/scope-key";
  /** Label: readable agent id, only when it is a valid label value. */
  public static final String AGENT = "agentbox.dev/agent";
  /** Label: readable user id, only when it is a valid label value. */
  public static final String USER = "agentbox.dev/user";
  /** Label: readable session id, only when it is a valid label value. */
  public static final String SESSION = "agentbox.dev/session";
  /** Label: the Sandbox an object belongs to. */
  public static final String SANDBOX = "agentbox.dev/sandbox";
  /** Label: the standard managed-by label. */
  public static final String MANAGED_BY = "app.kubernetes.io/managed-by";
  /** Value of {@link #MANAGED_BY} on everything agentbox makes. */
  public static final String MANAGER = "agentbox";
  /** Annotation: raw agent id. */
  public static final String AGENT_ID = "agentbox.dev/agent-id";
  /** Annotation: raw user id. */
  public static final String USER_ID = "agentbox.dev/user-id";
  /** Annotation: raw session id. */
  public static final String SESSION_ID = "agentbox.dev/session-id";
  /** Hex characters of a scope key. */
  public static final int SCOPE_KEY_LEN = 40;
  /** Longest label value and DNS-1123 label. */
  public static final int MAX_LABEL = 63;

  private static final Pattern LABEL_VALUE =
      Pattern.compile("[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?");

  /** The ids that identify a scope of its kind: agent, user, session (null when unused). */
  private static String[] ids(Scope s) {
    return switch (s.kind()) {
      case SESSION -> new String[] {s.agent(), null, s.session()};
      case USER -> new String[] {s.agent(), s.user(), null};
      case AGENT -> new String[] {s.agent(), null, null};
      case GLOBAL -> new String[] {null, null, null};
    };
  }

  static MessageDigest sha256() {
    try {
      return MessageDigest.getInstance("SHA-256");
    } catch (NoSuchAlgorithmException e) {
      // Every Java platform must provide SHA-256 (MessageDigest's contract).
      throw new IllegalStateException(e);
    }
  }

  /**
   * Hex SHA-256 over a versioned tag, the kind and each id (length-prefixed, so {@code a}+
   * {@code bc} and {@code ab}+{@code c} differ), truncated to 40 characters.
   */
  public static String scopeKey(Scope scope) {
    MessageDigest h = sha256();
    h.update("agentbox.dev/scope-key/v1\0".getBytes(StandardCharsets.UTF_8));
    h.update(scope.kind().labelValue().getBytes(StandardCharsets.UTF_8));
    for (String v : ids(scope)) {
      if (v == null) {
        h.update((byte) 0);
      } else {
        byte[] raw = v.getBytes(StandardCharsets.UTF_8);
        h.update((byte) 1);
        long n = raw.length;
        for (int i = 7; i >= 0; i--) {
          h.update((byte) (n >>> (8 * i)));
        }
        h.update(raw);
      }
    }
    return HexFormat.of().formatHex(h.digest()).substring(0, SCOPE_KEY_LEN);
  }

  /**
   * Whether {@code value} is a valid Kubernetes label value (empty, or up to 63 characters of
   * {@code [A-Za-z0-9._-]} starting and ending with an alphanumeric).
   */
  public static boolean isValidLabelValue(String value) {
    if (value.isEmpty()) {
      return true;
    }
    return value.length() <= MAX_LABEL && LABEL_VALUE.matcher(value).matches();
  }

  /** Labels every object of a scope carries: kind, key, managed-by, the readable valid ids. */
  public static Map<String, String> scopeLabels(Scope scope) {
    Map<String, String> l = new LinkedHashMap<>();
    l.put(SCOPE, scope.kind().labelValue());
    l.put(SCOPE_KEY, scopeKey(scope));
    l.put(MANAGED_BY, MANAGER);
    String[] ids = ids(scope);
    String[] keys = {AGENT, USER, SESSION};
    for (int i = 0; i < 3; i++) {
      if (ids[i] != null && !ids[i].isEmpty() && isValidLabelValue(ids[i])) {
        l.put(keys[i], ids[i]);
      }
    }
    return l;
  }

  /** Annotations holding the raw ids of a scope. */
  public static Map<String, String> scopeAnnotations(Scope scope) {
    Map<String, String> a = new LinkedHashMap<>();
    String[] ids = ids(scope);
    String[] keys = {AGENT_ID, USER_ID, SESSION_ID};
    for (int i = 0; i < 3; i++) {
      if (ids[i] != null) {
        a.put(keys[i], ids[i]);
      }
    }
    return a;
  }

  /** A label selector matching every object of a scope. */
  public static String scopeSelector(Scope scope) {
    return SCOPE_KEY + "=" + scopeKey(scope);
  }

  /**
   * {@code base} when it fits in {@code max} bytes; else a prefix, {@code -} and 16 hex
   * characters of its SHA-256 (the prefix trimmed of trailing {@code -}/{@code .}).
   */
  public static String boundedName(String base, int max) {
    byte[] raw = base.getBytes(StandardCharsets.UTF_8);
    if (raw.length <= max) {
      return base;
    }
    String digest = HexFormat.of().formatHex(sha256().digest(raw));
    // Names are ASCII in practice; like Python's base[:n], this cuts characters, not bytes.
    String prefix = base.substring(0, Math.min(base.length(), Math.max(max - 17, 0)));
    int end = prefix.length();
    while (end > 0 && (prefix.charAt(end - 1) == '-' || prefix.charAt(end - 1) == '.')) {
      end--;
    }
    return prefix.substring(0, end) + "-" + digest.substring(0, 16);
  }

  /** The Sandbox name of a scope (deterministic, so racing creators get one object). */
  public static String sandboxNameForScope(Scope scope) {
    return scope.kind().labelValue() + "-" + scopeKey(scope).substring(0, 24);
  }

  /** The pod name of a sandbox. */
  public static String podName(String sandbox) {
    return boundedName("sbx-" + sandbox, MAX_LABEL);
  }

  /** The {@link #SANDBOX} label value of a sandbox. */
  public static String sandboxLabelValue(String sandbox) {
    return boundedName(sandbox, MAX_LABEL);
  }

  /** The execution-guard Lease name of a scope key. */
  public static String leaseName(String key) {
    return "agentbox-guard-" + key;
  }
}
