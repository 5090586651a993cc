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
    Object cred =
        SandboxSpec.image("b")
            .allowDomain("pypi.org")
            .allowDomainWithCredential("api.example.com", "model-key", "token", null, 443)
            .allowDomainWithCredential("api.example.org", "k", "t", "X-Api-Key")
            .toMap()
            .get("network");
    assertEquals(
        Map.of(
            "egress",
            "Allowlist",
            "allow",
            List.of(
                Map.of("domain", "pypi.org"),
                Map.of(
                    "domain",
                    "api.example.com",
                    "ports",
                    List.of(Map.of("port", 443)),
                    "credential",
                    Map.of("secretName", "model-key", "key", "token")),
                Map.of(
                    "domain",
                    "api.example.org",
                    "credential",
                    Map.of("secretName", "k", "key", "t", "header", "X-Api-Key")))),
        cred);
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

  /**
   * The cross-language rule ({@code tests/vectors/protocol.json}, from {@code
   * EgressCredential::fault}): allowDomainWithCredential refuses exactly what the CRD's rules
   * refuse. A cidr entry cannot carry a credential here at all (no such method).
   */
  @Test
  void credentialsAreRefusedAsTheCrdsRulesRefuseThem() {
    Map<String, String> words =
        Map.of(
            "domain", "not the wildcard",
            "secret_name", "secretName must be",
            "key", "key must be",
            "header", "header must be");
    List<Map<String, Object>> cases = VectorsTest.list(VectorsTest.V, "credentials");
    assertTrue(cases.size() > 10, "credential vectors");
    for (Map<String, Object> c : cases) {
      String domain = VectorsTest.s(c, "domain");
      if (domain == null) {
        continue;
      }
      String fault = VectorsTest.s(c, "fault");
      SandboxSpec spec = SandboxSpec.image("b");
      Runnable call =
          () ->
              spec.allowDomainWithCredential(
                  domain,
                  VectorsTest.s(c, "secretName"),
                  VectorsTest.s(c, "key"),
                  VectorsTest.s(c, "header"));
      if (fault == null) {
        call.run();
      } else {
        InvalidRequestException e = assertThrows(InvalidRequestException.class, call::run);
        assertTrue(e.getMessage().contains(words.get(fault)), c + ": " + e.getMessage());
      }
    }
  }

  @Test
  void aBadCredentialIsRefusedNamingItsCause() {
    String[][] bad = {
      {"*.example.com", "k", "t", null, "not the wildcard"},
      {"api.example.com", "", "t", null, "secretName must be a Kubernetes object name"},
      {"api.example.com", null, "t", null, "secretName must be"},
      {"api.example.com", "Model_Key", "t", null, "secretName must be"},
      {"api.example.com", "k", "", null, "key must be a Secret key"},
      {"api.example.com", "k", null, null, "key must be a Secret key"},
      {"api.example.com", "k", "a/b", null, "key must be a Secret key"},
      {"api.example.com", "k", "..", null, "key must be a Secret key"},
      {"api.example.com", "k", "t", "", "header must be an HTTP header name"},
      {"api.example.com", "k", "t", "Host", "header must be"},
      {"api.example.com", "k", "t", "Proxy-Authorization", "header must be"},
      {"api.example.com", "k", "t", "X Key", "header must be"},
      {"api.example.com", "k", "t", "a".repeat(65), "header must be"},
    };
    for (String[] c : bad) {
      SandboxSpec spec = SandboxSpec.image("b");
      InvalidRequestException e =
          assertThrows(
              InvalidRequestException.class,
              () -> spec.allowDomainWithCredential(c[0], c[1], c[2], c[3]));
      assertTrue(e.getMessage().contains(c[4]), e.getMessage());
      assertEquals(null, spec.toMap().get("network"), "nothing is left half-set");
    }
  }
}
