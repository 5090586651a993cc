package dev.agentbox;

import com.fasterxml.jackson.annotation.JsonCreator;
import com.fasterxml.jackson.annotation.JsonIgnoreProperties;
import com.fasterxml.jackson.annotation.JsonProperty;

/**
 * The isolation key of a JVM agent harness (session / user / agent / global, as the agentscope
 * harness's sandbox layer keys its sandboxes), mapped one to one to an agentbox {@link Scope}:
 * the same key always names the same Sandbox, Lease and snapshot lineage, in every client.
 *
 * @param type which isolation the harness asked for
 * @param agent the agent's id (null for {@link Type#GLOBAL})
 * @param id the session id for {@link Type#SESSION}, the user id for {@link Type#USER}, else null
 */
@JsonIgnoreProperties(ignoreUnknown = true) // Jackson 2 fails on unknown properties by default
public record IsolationKey(
    @JsonProperty("type") Type type, @JsonProperty("agent") String agent, @JsonProperty("id") String id) {

  /** The isolation levels, each one agentbox {@link ScopeKind}. */
  public enum Type {
    SESSION(ScopeKind.SESSION),
    USER(ScopeKind.USER),
    AGENT(ScopeKind.AGENT),
    GLOBAL(ScopeKind.GLOBAL);

    private final ScopeKind kind;

    Type(ScopeKind kind) {
      this.kind = kind;
    }

    public ScopeKind scopeKind() {
      return kind;
    }

    static Type of(ScopeKind k) {
      for (Type t : values()) {
        if (t.kind == k) {
          return t;
        }
      }
      throw new IllegalStateException("no isolation type for " + k);
    }
  }

  @JsonCreator
  public IsolationKey {
    if (type == null) {
      throw new InvalidRequestException("an isolation key needs its type");
    }
    toScope(type, agent, id); // validates with the CRD's rules
  }

  public static IsolationKey session(String agent, String sessionId) {
    return new IsolationKey(Type.SESSION, agent, sessionId);
  }

  public static IsolationKey user(String agent, String userId) {
    return new IsolationKey(Type.USER, agent, userId);
  }

  public static IsolationKey agent(String agent) {
    return new IsolationKey(Type.AGENT, agent, null);
  }

  public static IsolationKey global() {
    return new IsolationKey(Type.GLOBAL, null, null);
  }

  /** The agentbox scope of this key. */
  public Scope toScope() {
    return toScope(type, agent, id);
  }

  private static Scope toScope(Type type, String agent, String id) {
    return switch (type) {
      case SESSION -> Scope.forSession(agent, id);
      case USER -> Scope.forUser(agent, id);
      case AGENT -> {
        if (id != null) {
          throw new InvalidRequestException("an AGENT isolation key takes no id");
        }
        yield Scope.forAgent(agent);
      }
      case GLOBAL -> {
        if (agent != null || id != null) {
          throw new InvalidRequestException("a GLOBAL isolation key takes no agent or id");
        }
        yield Scope.forGlobal();
      }
    };
  }

  /** The key of a scope (the inverse of {@link #toScope()}). */
  public static IsolationKey of(Scope s) {
    return switch (s.kind()) {
      case SESSION -> session(s.agent(), s.session());
      case USER -> user(s.agent(), s.user());
      case AGENT -> agent(s.agent());
      case GLOBAL -> global();
    };
  }
}
