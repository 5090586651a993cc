package dev.agentbox;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.Map;
import org.junit.jupiter.api.Test;
import tools.jackson.databind.json.JsonMapper;

/** The harness's shapes: the state record's JSON form and the isolation key's mapping. */
class StateTest {
  static final JsonMapper JSON = JsonMapper.builder().build();

  @Test
  void theStateRoundTripsUnderItsStableTypeName() {
    SandboxState s = SandboxState.of(IsolationKey.user("coder", "alice@example.com"), "team-a")
        .withLastSnapshot("user-abc-x7k2p");
    String json = JSON.writeValueAsString(s);
    Map<String, Object> tree = Kube.cast(JSON.readValue(json, Map.class));
    assertEquals(SandboxState.TYPE, tree.get("@type"));
    assertEquals("team-a", tree.get("namespace"));
    assertEquals(Labels.sandboxNameForScope(Scope.forUser("coder", "alice@example.com")), tree.get("sandbox"));
    assertEquals(s, JSON.readValue(json, SandboxState.class));
  }

  @Test
  void aStateFromALaterVersionWithMoreFieldsStillReads() {
    String json = "{\"@type\":\"agentbox.SandboxState/v1\",\"key\":{\"type\":\"GLOBAL\"},"
        + "\"namespace\":\"n\",\"sandbox\":\"s\",\"lastSnapshot\":null,\"future\":1}";
    SandboxState s = JSON.readValue(json, SandboxState.class);
    assertEquals(Scope.forGlobal(), s.scope());
  }

  @Test
  void isolationKeysMapOneToOneToScopes() {
    assertEquals(Scope.forSession("a", "s"), IsolationKey.session("a", "s").toScope());
    assertEquals(Scope.forUser("a", "u"), IsolationKey.user("a", "u").toScope());
    assertEquals(Scope.forAgent("a"), IsolationKey.agent("a").toScope());
    assertEquals(Scope.forGlobal(), IsolationKey.global().toScope());
    for (IsolationKey.Type t : IsolationKey.Type.values()) {
      assertEquals(t, IsolationKey.Type.valueOf(t.scopeKind().name()));
    }
  }

  @Test
  void badKeysFailBeforeAnyRequest() {
    assertThrows(InvalidRequestException.class, () -> IsolationKey.session("a", null));
    assertThrows(InvalidRequestException.class, () -> new IsolationKey(IsolationKey.Type.AGENT, "a", "x"));
    assertThrows(InvalidRequestException.class, () -> new IsolationKey(IsolationKey.Type.GLOBAL, "a", null));
    assertThrows(InvalidRequestException.class, () -> Scope.forUser("a", "x".repeat(254)));
  }

  @Test
  void theTypedResourcesCarryTheCrdsGroupVersionAndPlural() {
    assertEquals("agentbox.dev/v1alpha1", new dev.agentbox.model.Sandbox().getApiVersion());
    assertEquals("sandboxsnapshots", io.fabric8.kubernetes.api.model.HasMetadata.getPlural(dev.agentbox.model.SandboxSnapshot.class));
    assertEquals("SandboxPool", new dev.agentbox.model.SandboxPool().getKind());
    assertTrue(new dev.agentbox.model.SandboxTemplate() instanceof io.fabric8.kubernetes.api.model.Namespaced);
  }
}
