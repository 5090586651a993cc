package dev.agentbox;

import io.fabric8.kubernetes.client.Config;
import io.fabric8.kubernetes.client.KubernetesClient;
import io.fabric8.kubernetes.client.KubernetesClientBuilder;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.security.KeyFactory;
import java.security.spec.PKCS8EncodedKeySpec;
import java.util.Base64;

/**
 * fabric8 clients configured as kubectl would be (kubeconfig, or the service account in a pod).
 *
 * <p>Why not {@code new KubernetesClientBuilder().build()} alone: fabric8 reads a client key in
 * PKCS#8 form ({@code BEGIN PRIVATE KEY}) as RSA unless told its algorithm, so a kubeconfig with
 * an EC or Ed25519 key (what kubeadm-style PKI and this project's local cluster write) fails with
 * "Invalid DER". Here the algorithm is read from the key itself.
 */
public final class Clients {
  private Clients() {}

  /**
   * A client of the default configuration. A configuration that cannot be read (a broken
   * kubeconfig, a missing certificate file) is an {@link InvalidRequestException} naming it.
   */
  public static KubernetesClient kubernetesClient() {
    Logging.quietIfUnconfigured();
    try {
      Config cfg = Config.autoConfigure(null);
      if (System.getProperty(Config.KUBERNETES_CLIENT_KEY_ALGO_SYSTEM_PROPERTY) == null) {
        String algo = pkcs8Algorithm(cfg);
        if (algo != null) {
          cfg.setClientKeyAlgo(algo);
        }
      }
      return new KubernetesClientBuilder().withConfig(cfg).build();
    } catch (RuntimeException e) {
      throw new InvalidRequestException("the Kubernetes client configuration (kubeconfig or "
          + "service account) could not be used: " + e.getMessage(), e);
    }
  }

  /** The algorithm of a PKCS#8 client key, or null (none, or another form fabric8 reads). */
  static String pkcs8Algorithm(Config cfg) {
    String pem;
    try {
      if (cfg.getClientKeyData() != null && !cfg.getClientKeyData().isEmpty()) {
        pem = new String(Base64.getDecoder().decode(cfg.getClientKeyData().strip()), StandardCharsets.UTF_8);
      } else if (cfg.getClientKeyFile() != null && !cfg.getClientKeyFile().isEmpty()) {
        pem = java.nio.file.Files.readString(Path.of(cfg.getClientKeyFile()), StandardCharsets.UTF_8);
      } else {
        return null;
      }
    } catch (IOException | IllegalArgumentException e) {
      return null; // fabric8 reports an unreadable key itself
    }
    String begin = "-----BEGIN PRIVATE KEY-----";
    int s = pem.indexOf(begin);
    int e = pem.indexOf("-----END PRIVATE KEY-----");
    if (s < 0 || e < s) {
      return null;
    }
    byte[] der = Base64.getMimeDecoder().decode(pem.substring(s + begin.length(), e));
    for (String algo : new String[] {"RSA", "EC", "Ed25519", "EdDSA"}) {
      try {
        KeyFactory.getInstance(algo).generatePrivate(new PKCS8EncodedKeySpec(der));
        return algo;
      } catch (java.security.GeneralSecurityException ex) {
        // not this one
      }
    }
    return null;
  }
}
