package dev.agentbox;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

class SpecTest {
  @Test
  void egressIsTheClustersDefaultUnlessSetAndAllowBuildsAnAllowlist() {
    assertFalse(SandboxSpec.image("busybox:1.37").toMap().containsKey("network"));
    assertEquals(
        Map.of("egress", "All"), SandboxSpec.image("b").egress("All").toMap().get("network"));
    Object net = SandboxSpec.image("b").allow("10.0.0.0/8", 443).allow("192.0.2.7/32").toMap().get("network");
    assertEquals(
        Map.of(
            "egress",
            "Allowlist",
            "allow",
            List.of(
                Map.of("cidr", "10.0.0.0/8", "ports", List.of(Map.of("port", 443))),
                Map.of("cidr", "192.0.2.7/32"))),
        net);
    Object dom = SandboxSpec.image("b").allowDomain("pypi.org", 443).allow("10.0.0.0/8").toMap().get("network");
    assertEquals(
        Map.of(
            "egress",
            "Allowlist",
            "allow",
            List.of(
                Map.of("domain", "pypi.org", "ports", List.of(Map.of("port", 443))),
                Map.of("cidr", "10.0.0.0/8"))),
        dom);
  }

  @Test
  void aBadDomainIsRefusedNamingIt() {
    for (String bad : new String[] {"PyPI.org", "localhost", "10.0.0.1", "a.*.example.com", "", null}) {
      InvalidRequestException e =
          assertThrows(InvalidRequestException.class, () -> SandboxSpec.image("b").allowDomain(bad));
      assertTrue(e.getMessage().contains("domain must be a lower-case DNS name"), e.getMessage());
    }
    assertThrows(InvalidRequestException.class, () -> SandboxSpec.image("b").allowDomain("pypi.org", 0));
    Object ok = SandboxSpec.image("b").allowDomain("*.github.com").toMap().get("network");
    assertEquals(Map.of("egress", "Allowlist", "allow", List.of(Map.of("domain", "*.github.com"))), ok);
  }
}
