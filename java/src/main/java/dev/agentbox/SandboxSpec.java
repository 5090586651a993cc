package dev.agentbox;

import java.util.LinkedHashMap;
import java.util.Map;

/**
 * A Sandbox's spec in its JSON form (the CRD's field names, see docs/reference.md), built
 * fluently: {@code SandboxSpec.image("busybox:1.37").imagePullPolicy("IfNotPresent")}. Fields
 * this class has no method for go in with {@link #set}. The scope is set by
 * {@link Sandboxes#getOrCreate}. The API server validates it; what it refuses comes back as
 * {@link InvalidRequestException} with its message.
 */
public final class SandboxSpec {
  private final Map<String, Object> fields = new LinkedHashMap<>();

  private SandboxSpec() {}

  /** A spec with an image. */
  public static SandboxSpec image(String image) {
    return new SandboxSpec().set("image", image);
  }

  /** A spec from a SandboxTemplate of the namespace. */
  public static SandboxSpec fromTemplate(String template) {
    if (template == null) {
      throw new InvalidRequestException("no template name (null)");
    }
    return new SandboxSpec().set("templateRef", Map.of("name", template));
  }

  /** A spec from its JSON form. */
  public static SandboxSpec of(Map<String, Object> json) {
    if (json == null) {
      throw new InvalidRequestException("no spec (null)");
    }
    SandboxSpec s = new SandboxSpec();
    s.fields.putAll(json);
    return s;
  }

  public SandboxSpec imagePullPolicy(String policy) {
    return set("imagePullPolicy", policy);
  }

  /** The workspace root in the container (default {@code /workspace}). */
  public SandboxSpec workspaceRoot(String root) {
    Map<String, Object> ws = new LinkedHashMap<>(Kube.obj(fields, "workspace"));
    ws.put("root", root);
    return set("workspace", ws);
  }

  /**
   * What the sandbox may reach: {@code "None"} (nothing), {@code "All"}, or {@code "Allowlist"}
   * (only the {@link #allow} entries). Unset: the cluster's default, {@code "None"} unless the
   * administrator changed it. A sandbox relying on a policy is Ready only where the operator
   * proved NetworkPolicy is enforced (condition {@code NetworkEnforced}).
   */
  public SandboxSpec egress(String egress) {
    Map<String, Object> net = new LinkedHashMap<>(Kube.obj(fields, "network"));
    net.put("egress", egress);
    return set("network", net);
  }

  /**
   * Allows an address block (CIDR notation) on the given TCP ports (none: every port), and sets
   * egress to {@code "Allowlist"}.
   */
  public SandboxSpec allow(String cidr, int... ports) {
    return allowEntry("cidr", cidr, ports);
  }

  /**
   * Allows a DNS name ({@code "pypi.org"}, or {@code "*.github.com"} for the names below it) on
   * the given TCP ports (none: every port), reached through agentbox's egress proxy, and sets
   * egress to {@code "Allowlist"}.
   */
  public SandboxSpec allowDomain(String domain, int... ports) {
    if (domain == null
        || domain.length() > 253
        || !DOMAIN.matcher(domain).matches()
        || !domain.contains(".")
        || NUMERIC_END.matcher(domain).find()) {
      // The CRD's rule, said here: a framework configures this long before the API server
      // sees it.
      throw new InvalidRequestException(
          "domain must be a lower-case DNS name with at least one dot, optionally starting with"
              + " '*.' (such as pypi.org or *.github.com), not "
              + (domain == null ? "null" : "\"" + domain + "\"")
              + "; addresses go in allow(cidr)");
    }
    for (int p : ports) {
      if (p < 1 || p > 65535) {
        throw new InvalidRequestException("port must be from 1 to 65535, not " + p);
      }
    }
    return allowEntry("domain", domain, ports);
  }

  /** The CRD's pattern of a domain entry. */
  private static final java.util.regex.Pattern DOMAIN =
      java.util.regex.Pattern.compile(
          "^([*][.])?([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?[.])*[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$");

  /** A name whose last label is a number: an address, which goes in a cidr entry. */
  private static final java.util.regex.Pattern NUMERIC_END =
      java.util.regex.Pattern.compile("[.][0-9]+$");

  private SandboxSpec allowEntry(String key, String value, int... ports) {
    Map<String, Object> net = new LinkedHashMap<>(Kube.obj(fields, "network"));
    java.util.List<Object> allow = new java.util.ArrayList<>();
    if (net.get("allow") instanceof java.util.List<?> l) {
      allow.addAll(l);
    }
    Map<String, Object> entry = new LinkedHashMap<>();
    entry.put(key, value);
    if (ports.length > 0) {
      java.util.List<Object> ps = new java.util.ArrayList<>();
      for (int p : ports) {
        ps.add(Map.of("port", p));
      }
      entry.put("ports", ps);
    }
    allow.add(entry);
    net.put("egress", "Allowlist");
    net.put("allow", allow);
    return set("network", net);
  }

  /** Any field of the spec, in its JSON form. */
  public SandboxSpec set(String field, Object value) {
    fields.put(field, value);
    return this;
  }

  /** A copy of the JSON form. */
  public Map<String, Object> toMap() {
    return new LinkedHashMap<>(fields);
  }
}
