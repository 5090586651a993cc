package dev.agentbox;

import java.util.ServiceLoader;
import org.slf4j.spi.SLF4JServiceProvider;

/**
 * Keeps SLF4J quiet in a JVM that has no logging set up, as a library should: this client
 * (through fabric8) only logs through {@code slf4j-api} and ships no provider, so a harness's
 * own logging (logback, log4j2, slf4j-simple...) gets fabric8's messages as always. Only when
 * the class path holds no SLF4J provider at all — where SLF4J 2 would print three "No SLF4J
 * providers were found" warnings and then drop every message anyway — it is told to use its
 * own no-operation provider ({@code slf4j.provider}) without saying so at INFO ({@code
 * slf4j.internal.verbosity=WARN}): the same outcome, without the noise. A system property the
 * harness set itself is never changed (set after SLF4J started, these two change nothing);
 * {@code -Dagentbox.slf4j.quiet=false} turns this off.
 */
final class Logging {
  private Logging() {}

  static final String PROVIDER_PROPERTY = "slf4j.provider";
  static final String VERBOSITY_PROPERTY = "slf4j.internal.verbosity";
  static final String OPT_OUT_PROPERTY = "agentbox.slf4j.quiet";
  /** SLF4J 2's own no-operation provider (in slf4j-api). */
  static final String NOP_PROVIDER = "org.slf4j.helpers.NOP_FallbackServiceProvider";

  private static volatile boolean done;

  /** Whether to choose SLF4J's no-operation provider (pure). */
  static boolean shouldQuiet(boolean providerPresent, String provider, String verbosity, String optOut) {
    if ("false".equalsIgnoreCase(optOut) || providerPresent) {
      return false;
    }
    // a harness that named a provider, or asked for SLF4J's own messages, decided already
    return (provider == null || provider.isEmpty()) && (verbosity == null || verbosity.isEmpty());
  }

  /** Whether an SLF4J provider is on the class path SLF4J looks at (none is instantiated). */
  static boolean providerPresent() {
    ClassLoader cl = org.slf4j.LoggerFactory.class.getClassLoader();
    try {
      return ServiceLoader.load(SLF4JServiceProvider.class, cl).stream().findAny().isPresent();
    } catch (java.util.ServiceConfigurationError e) {
      return true; // a provider is declared (if broken): SLF4J reports that itself
    }
  }

  /** Called before the first fabric8 class this client loads; once per JVM. */
  static synchronized void quietIfUnconfigured() {
    if (done) {
      return;
    }
    done = true;
    if (shouldQuiet(providerPresent(), System.getProperty(PROVIDER_PROPERTY),
        System.getProperty(VERBOSITY_PROPERTY), System.getProperty(OPT_OUT_PROPERTY))) {
      System.setProperty(PROVIDER_PROPERTY, NOP_PROVIDER);
      System.setProperty(VERBOSITY_PROPERTY, "WARN");
    }
  }
}
