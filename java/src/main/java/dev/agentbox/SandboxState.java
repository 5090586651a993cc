package dev.agentbox;

import com.fasterxml.jackson.annotation.JsonCreator;
import com.fasterxml.jackson.annotation.JsonIgnoreProperties;
import com.fasterxml.jackson.annotation.JsonProperty;
import com.fasterxml.jackson.annotation.JsonTypeInfo;
import com.fasterxml.jackson.annotation.JsonTypeName;
import java.util.Objects;

/**
 * Everything a harness needs to find its sandbox again after a restart, as the agentscope
 * harness serialises a per-session sandbox state with Jackson: the isolation key (so the
 * scope), the namespace, the Sandbox's name and the last snapshot taken of its workspace.
 * Small on purpose: the workspace itself stays in the cluster and the object store.
 *
 * <p>Serialised under the stable type name {@value #TYPE} (property {@code @type}), so a
 * polymorphic state store reads it back whatever this class is called in a later version;
 * unknown properties written by later versions are ignored.
 */
@JsonTypeInfo(use = JsonTypeInfo.Id.NAME, include = JsonTypeInfo.As.PROPERTY, property = "@type")
@JsonTypeName(SandboxState.TYPE)
@JsonIgnoreProperties(ignoreUnknown = true)
public record SandboxState(
    @JsonProperty("key") IsolationKey key,
    @JsonProperty("namespace") String namespace,
    @JsonProperty("sandbox") String sandbox,
    @JsonProperty("lastSnapshot") String lastSnapshot) {

  /** The type name in the JSON form. */
  public static final String TYPE = "agentbox.SandboxState/v1";

  @JsonCreator
  public SandboxState {
    Objects.requireNonNull(key, "key");
    Objects.requireNonNull(namespace, "namespace");
    Objects.requireNonNull(sandbox, "sandbox");
  }

  /** The state of a scope's own sandbox in a namespace, with no snapshot yet. */
  public static SandboxState of(IsolationKey key, String namespace) {
    return new SandboxState(key, namespace, Labels.sandboxNameForScope(key.toScope()), null);
  }

  /** The same state with another last snapshot. */
  public SandboxState withLastSnapshot(String snapshot) {
    return new SandboxState(key, namespace, sandbox, snapshot);
  }

  /** The scope of the key. */
  public Scope scope() {
    return key.toScope();
  }
}
