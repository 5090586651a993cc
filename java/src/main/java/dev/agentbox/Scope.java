package dev.agentbox;

import java.util.LinkedHashMap;
import java.util.Map;

/**
 * An isolation scope, validated on construction with the CRD's own rules (the ids a kind needs
 * are present, 1 to 253 characters; the others absent), so a bad scope fails before any
 * request. Ids need not be valid label values.
 */
public record Scope(ScopeKind kind, String agent, String user, String session) {
  /** Longest id the CRD accepts. */
  public static final int MAX_ID = 253;

  public Scope {
    if (kind == null) {
      throw new InvalidRequestException("a scope needs its kind");
    }
    check("agent", agent, kind != ScopeKind.GLOBAL, kind);
    check("user", user, kind == ScopeKind.USER, kind);
    check("session", session, kind == ScopeKind.SESSION, kind);
  }

  private static void check(String field, String value, boolean required, ScopeKind kind) {
    if (required) {
      if (value == null) {
        throw new InvalidRequestException(
            "scope." + field + " is required for a " + kind.wire() + " scope");
      }
      if (value.isEmpty() || value.length() > MAX_ID) {
        throw new InvalidRequestException(
            "scope." + field + " must be a string of 1 to " + MAX_ID + " characters");
      }
    } else if (value != null) {
      throw new InvalidRequestException(
          "scope." + field + " is not used by a " + kind.wire() + " scope");
    }
  }

  /** One session of an agent. */
  public static Scope forSession(String agent, String session) {
    return new Scope(ScopeKind.SESSION, agent, null, session);
  }

  /** One user of an agent, across sessions. */
  public static Scope forUser(String agent, String user) {
    return new Scope(ScopeKind.USER, agent, user, null);
  }

  /** One agent, shared by all its users. */
  public static Scope forAgent(String agent) {
    return new Scope(ScopeKind.AGENT, agent, null, null);
  }

  /** The single global lineage. */
  public static Scope forGlobal() {
    return new Scope(ScopeKind.GLOBAL, null, null, null);
  }

  /** The CRD's JSON form ({@code {"kind": "User", "agent": ..., "user": ...}}). */
  public Map<String, Object> toMap() {
    Map<String, Object> m = new LinkedHashMap<>();
    m.put("kind", kind.wire());
    if (agent != null) {
      m.put("agent", agent);
    }
    if (user != null) {
      m.put("user", user);
    }
    if (session != null) {
      m.put("session", session);
    }
    return m;
  }

  /** Reads the CRD's JSON form. */
  public static Scope fromMap(Map<?, ?> m) {
    if (m == null) {
      throw new InvalidRequestException("no scope");
    }
    Object kind = m.get("kind");
    return new Scope(
        ScopeKind.fromWire(kind == null ? null : kind.toString()),
        str(m.get("agent")),
        str(m.get("user")),
        str(m.get("session")));
  }

  private static String str(Object o) {
    return o == null ? null : o.toString();
  }
}
