package dev.agentbox;

import com.fasterxml.jackson.annotation.JsonCreator;
import com.fasterxml.jackson.annotation.JsonIgnoreProperties;
import com.fasterxml.jackson.annotation.JsonProperty;
import com.fasterxml.jackson.annotation.JsonTypeInfo;
import com.fasterxml.jackson.annotation.JsonTypeName;
import tools.jackson.core.JacksonException;
import tools.jackson.databind.json.JsonMapper;

/**
 * Everything a harness needs to find its sandbox again after a restart, as the agentscope
 * harness serialises a per-session sandbox state with Jackson: the isolation key (so the
 * scope), the namespace, the Sandbox's name and the last snapshot taken of its workspace.
 * Small on purpose: the workspace itself stays in the cluster and the object store.
 *
 * <p>Serialised under the stable type name {@value #TYPE} (property {@code @type}), so a
 * polymorphic state store reads it back whatever this class is called in a later version;
 * unknown properties written by later versions are ignored (here and in the key).
 *
 * <p>Which Jackson: the annotations are jackson-annotations' ({@code com.fasterxml.jackson.annotation}),
 * which Jackson 2 and Jackson 3 both read, so a harness's own Jackson 2 {@code ObjectMapper}
 * (agentscope-java's 2.21) and a Jackson 3 {@code JsonMapper} (fabric8 8's) write and read the
 * same JSON, as they come, with no module to register. A harness that stores strings instead
 * uses {@link #toJson()} and {@link #fromJson(String)}: the same JSON, no Jackson of its own.
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

  /** The client's own mapper (Jackson 3, fabric8's), for the plain string form. */
  private static final JsonMapper JSON = JsonMapper.builder().build();

  @JsonCreator
  public SandboxState {
    if (key == null || namespace == null || sandbox == null) {
      throw new InvalidRequestException("a SandboxState needs its key, namespace and sandbox"
          + " (missing: " + (key == null ? "key " : "") + (namespace == null ? "namespace " : "")
          + (sandbox == null ? "sandbox" : "").strip() + ")");
    }
  }

  /** The JSON form, the same any Jackson mapper writes (with {@code @type}), as a string. */
  public String toJson() {
    return JSON.writeValueAsString(this);
  }

  /**
   * A state from its JSON form ({@link #toJson()}, or any Jackson mapper's); {@link
   * InvalidRequestException} naming the cause for anything else (not JSON, another type name,
   * a missing field).
   */
  public static SandboxState fromJson(String json) {
    if (json == null) {
      throw new InvalidRequestException("no SandboxState JSON (null)");
    }
    try {
      return JSON.readValue(json, SandboxState.class);
    } catch (JacksonException e) {
      // a constructor's own refusal, wrapped by Jackson: the clearer message
      for (Throwable c = e.getCause(); c != null; c = c.getCause()) {
        if (c instanceof InvalidRequestException ire) {
          throw new InvalidRequestException("not a " + TYPE + ": " + ire.getMessage(), e);
        }
      }
      throw new InvalidRequestException("not a " + TYPE + ": " + e.getOriginalMessage(), e);
    }
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
