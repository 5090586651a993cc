package dev.agentbox;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.File;
import java.net.ServerSocket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * No SLF4J noise unless the harness configures logging: a client start in a fresh JVM (SLF4J
 * starts once per JVM) with no provider prints nothing on stderr, and one with the harness's
 * own provider gets that provider, untouched.
 */
class LoggingTest {
  record Run(int exit, String out, String err) {}

  static Run start(Path dir, String extraClassPath, String... props) throws Exception {
    int port;
    try (ServerSocket s = new ServerSocket(0, 1, java.net.InetAddress.getLoopbackAddress())) {
      port = s.getLocalPort(); // closed again: nothing listens there
    }
    Path kubeconfig = dir.resolve("kubeconfig");
    java.nio.file.Files.writeString(kubeconfig, "apiVersion: v1\nkind: Config\n"
        + "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:" + port + "'}}]\n"
        + "contexts: [{name: c, context: {cluster: c, user: u, namespace: team-a}}]\n"
        + "current-context: c\nusers: [{name: u, user: {token: t}}]\n");
    String cp = System.getProperty("surefire.test.class.path", System.getProperty("java.class.path"));
    if (extraClassPath != null) {
      cp = extraClassPath + File.pathSeparator + cp;
    }
    List<String> cmd = new ArrayList<>(List.of(
        Path.of(System.getProperty("java.home"), "bin", "java").toString(),
        "-cp", cp,
        "-Dkubeconfig=" + kubeconfig,
        "-Dkubernetes.request.retry.backoffLimit=0"));
    cmd.addAll(List.of(props));
    cmd.add(ClientStart.class.getName());
    Path out = dir.resolve("out");
    Path err = dir.resolve("err");
    Process p = new ProcessBuilder(cmd).redirectOutput(out.toFile()).redirectError(err.toFile()).start();
    if (!p.waitFor(120, TimeUnit.SECONDS)) {
      p.destroyForcibly();
      throw new AssertionError("the client start did not end");
    }
    return new Run(p.exitValue(), java.nio.file.Files.readString(out, StandardCharsets.UTF_8),
        java.nio.file.Files.readString(err, StandardCharsets.UTF_8));
  }

  @Test
  void aClientStartWithNoLoggingConfiguredPrintsNothingOnStderr(@TempDir Path dir) throws Exception {
    Run r = start(dir, null);
    assertEquals(0, r.exit(), r.out() + r.err());
    assertTrue(r.out().contains("call failed as expected\n"), r.out());
    assertTrue(r.out().endsWith("done\n"), r.out());
    assertEquals("", r.err(), "stderr of a client start");
  }

  @Test
  void aHarnesssOwnProviderIsUsedAndLeftAlone(@TempDir Path dir) throws Exception {
    Path services = dir.resolve("provider/META-INF/services");
    java.nio.file.Files.createDirectories(services);
    java.nio.file.Files.writeString(services.resolve("org.slf4j.spi.SLF4JServiceProvider"),
        RecordingProvider.class.getName() + "\n");
    Run r = start(dir, dir.resolve("provider").toString());
    assertEquals(0, r.exit(), r.out() + r.err());
    assertTrue(r.out().contains("the harness's provider is in use\n"), r.out());
    assertTrue(r.out().contains("slf4j.provider=null\n"), r.out());
    assertFalse(r.err().contains("SLF4J"), r.err());
  }

  @Test
  void aHarnessThatAsksForSlf4jsOwnMessagesGetsThem(@TempDir Path dir) throws Exception {
    Run r = start(dir, null, "-Dslf4j.internal.verbosity=INFO");
    assertEquals(0, r.exit(), r.out() + r.err());
    assertTrue(r.err().contains("No SLF4J providers were found"), r.err());
  }

  @Test
  void onlyAClassPathWithoutAnyProviderAndNoChoiceOfTheHarnessIsQuietened() {
    assertTrue(Logging.shouldQuiet(false, null, null, null));
    assertTrue(Logging.shouldQuiet(false, "", "", "true"));
    assertFalse(Logging.shouldQuiet(true, null, null, null)); // a provider: the harness's logging
    assertFalse(Logging.shouldQuiet(false, "org.example.Provider", null, null));
    assertFalse(Logging.shouldQuiet(false, null, "DEBUG", null));
    assertFalse(Logging.shouldQuiet(false, null, null, "false")); // -Dagentbox.slf4j.quiet=false
  }
}
