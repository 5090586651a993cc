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

  /** A harness's own Jackson 2 ObjectMapper (agentscope-java uses 2.21), as it comes. */
  static final com.fasterxml.jackson.databind.ObjectMapper JACKSON2 = new com.fasterxml.jackson.databind.ObjectMapper();

  @Test
  void theStateRoundTripsThroughAJackson2ObjectMapper() throws Exception {
    for (SandboxState s : samples()) {
      String json = JACKSON2.writeValueAsString(s);
      Map<String, Object> tree = Kube.cast(JACKSON2.readValue(json, Map.class));
      assertEquals(SandboxState.TYPE, tree.get("@type"), json);
      assertEquals(s.namespace(), tree.get("namespace"));
      assertEquals(s, JACKSON2.readValue(json, SandboxState.class), json);
      // what one Jackson wrote the other reads (a harness moving from 2 to 3 keeps its states)
      assertEquals(s, JSON.readValue(json, SandboxState.class));
      assertEquals(s, JACKSON2.readValue(JSON.writeValueAsString(s), SandboxState.class));
    }
    String later = "{\"@type\":\"agentbox.SandboxState/v1\",\"key\":{\"type\":\"AGENT\",\"agent\":\"a\",\"x\":2},"
        + "\"namespace\":\"n\",\"sandbox\":\"s\",\"future\":1}";
    assertEquals(Scope.forAgent("a"), JACKSON2.readValue(later, SandboxState.class).scope());
  }

  @Test
  void theStateHasAPlainStringFormForHarnessesWithoutJackson() {
    for (SandboxState s : samples()) {
      String json = s.toJson();
      assertEquals(s, SandboxState.fromJson(json));
      assertEquals(json, JSON.writeValueAsString(s)); // the same form the mappers write
    }
    assertThrows(InvalidRequestException.class, () -> SandboxState.fromJson("{\"@type\":\"other/v9\",\"key\":{\"type\":\"GLOBAL\"},"
        + "\"namespace\":\"n\",\"sandbox\":\"s\"}"));
    assertThrows(InvalidRequestException.class, () -> SandboxState.fromJson("{\"@type\":\"agentbox.SandboxState/v1\"}"));
    assertThrows(InvalidRequestException.class, () -> SandboxState.fromJson("not json"));
    assertThrows(InvalidRequestException.class, () -> SandboxState.fromJson(null));
  }

  @Test
  void aStateMissingAFieldIsAClearErrorNotANullPointer() {
    assertThrows(InvalidRequestException.class, () -> new SandboxState(null, "n", "s", null));
    assertThrows(InvalidRequestException.class, () -> new SandboxState(IsolationKey.global(), null, "s", null));
    assertThrows(InvalidRequestException.class, () -> new IsolationKey(null, "a", null));
  }

  static java.util.List<SandboxState> samples() {
    return java.util.List.of(
        SandboxState.of(IsolationKey.user("coder", "alice@example.com"), "team-a").withLastSnapshot("user-abc-x7k2p"),
        SandboxState.of(IsolationKey.session("coder", "s-1"), "team-a"),
        SandboxState.of(IsolationKey.agent("coder"), "n"),
        SandboxState.of(IsolationKey.global(), "n").withLastSnapshot("g-1"));
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
