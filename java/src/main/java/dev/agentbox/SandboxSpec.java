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

  /**
   * Allows an exact DNS name through agentbox's egress proxy, which adds key {@code key} of
   * Secret {@code secretName} (in the sandbox's namespace) as the header {@code header} ({@code
   * null}: {@code Authorization}) to every request to it, so the sandbox never holds the key: the
   * sandbox calls {@code http://domain/...} through the proxy, which speaks TLS to the server,
   * verifies it and sets the header. The Secret's annotation {@code
   * agentbox.dev/credential-domains} must allow the domain; otherwise the sandbox gets no pod
   * (reason {@code CredentialRefused}). Sets egress to {@code "Allowlist"}.
   */
  public SandboxSpec allowDomainWithCredential(
      String domain, String secretName, String key, String header, int... ports) {
    if (domain != null && domain.startsWith("*.")) {
      // The CRD's rule: a wildcard would send the key to every name below it.
      throw new InvalidRequestException(
          "a credential goes only on an exact domain, not the wildcard \"" + domain + "\"");
    }
    // The CRD's rules for the credential, said before any request (the value stays in the
    // Secret: whether it allows the domain is the operator's to check).
    if (secretName == null
        || secretName.length() > 253
        || !OBJECT_NAME.matcher(secretName).matches()) {
      throw new InvalidRequestException(
          "secretName must be a Kubernetes object name: lowercase letters, digits, '-' and '.',"
              + " starting and ending with a letter or digit, not "
              + quoted(secretName));
    }
    if (key == null
        || key.length() > 253
        || key.equals(".")
        || key.equals("..")
        || !DATA_KEY.matcher(key).matches()) {
      throw new InvalidRequestException(
          "key must be a Secret key: letters, digits, '-', '_' and '.', not " + quoted(key));
    }
    if (header != null && !headerOk(header)) {
      throw new InvalidRequestException(
          "header must be an HTTP header name that is not Host, Connection, Content-Length,"
              + " Transfer-Encoding, Keep-Alive, Upgrade, TE, Trailer or Proxy-*, not "
              + quoted(header)
              + " (null: Authorization)");
    }
    allowDomain(domain, ports);
    Map<String, Object> net = new LinkedHashMap<>(Kube.obj(fields, "network"));
    java.util.List<Object> allow = new java.util.ArrayList<>();
    if (net.get("allow") instanceof java.util.List<?> l) {
      allow.addAll(l);
    }
    @SuppressWarnings("unchecked")
    Map<String, Object> last =
        new LinkedHashMap<>((Map<String, Object>) allow.get(allow.size() - 1));
    Map<String, Object> cred = new LinkedHashMap<>();
    cred.put("secretName", secretName);
    cred.put("key", key);
    if (header != null) {
      cred.put("header", header);
    }
    last.put("credential", cred);
    allow.set(allow.size() - 1, last);
    net.put("allow", allow);
    return set("network", net);
  }

  /** The CRD's pattern of a credential's Secret name (a Kubernetes object name). */
  private static final java.util.regex.Pattern OBJECT_NAME =
      java.util.regex.Pattern.compile(
          "^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$");

  /** The CRD's pattern of a credential's key (a Secret data key). */
  private static final java.util.regex.Pattern DATA_KEY =
      java.util.regex.Pattern.compile("^[-._a-zA-Z0-9]+$");

  /** The CRD's pattern of a credential's header (an HTTP token). */
  private static final java.util.regex.Pattern HEADER =
      java.util.regex.Pattern.compile("^[-!#$%&'*+.^_`|~0-9a-zA-Z]+$");

  /** The headers the egress proxy owns (nor may a credential be Proxy-*). */
  private static final java.util.Set<String> PROXY_HEADERS =
      java.util.Set.of(
          "host",
          "connection",
          "content-length",
          "transfer-encoding",
          "keep-alive",
          "upgrade",
          "te",
          "trailer");

  private static boolean headerOk(String header) {
    String lower = header.toLowerCase(java.util.Locale.ROOT);
    return header.length() <= 64
        && HEADER.matcher(header).matches()
        && !PROXY_HEADERS.contains(lower)
        && !lower.startsWith("proxy-");
  }

  private static String quoted(String s) {
    return s == null ? "null" : "\"" + s + "\"";
  }

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
