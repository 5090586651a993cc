package dev.agentbox;

/** Kind of isolation scope (the CRD's {@code scope.kind}). */
public enum ScopeKind {
  /** One agent session: needs agent and session. */
  SESSION("Session"),
  /** One user of one agent, across sessions: needs agent and user. */
  USER("User"),
  /** One agent, shared by all its users: needs agent. */
  AGENT("Agent"),
  /** One lineage for everything: takes no ids. */
  GLOBAL("Global");

  private final String wire;

  ScopeKind(String wire) {
    this.wire = wire;
  }

  /** The CRD's spelling ({@code Session}, ...). */
  public String wire() {
    return wire;
  }

  /** The lower-case form of the {@code agentbox.dev/scope} label. */
  public String labelValue() {
    return wire.toLowerCase(java.util.Locale.ROOT);
  }

  /** Reads the CRD's spelling. */
  public static ScopeKind fromWire(String s) {
    for (ScopeKind k : values()) {
      if (k.wire.equals(s)) {
        return k;
      }
    }
    throw new InvalidRequestException(
        "scope.kind must be one of Session, User, Agent, Global, not " + s);
  }
}
