package dev.agentbox;

import java.nio.charset.StandardCharsets;
import java.time.Duration;

/** The Java of README.md (an excerpt of this file), run by ClusterTest on the real cluster. */
final class ReadmeExample {
  private ReadmeExample() {}

  static String turn(String namespace) {
    try (Sandboxes sandboxes = Sandboxes.connect(namespace)) { // null: the kubeconfig's
      Scope scope = Scope.forUser("coder", "alice@example.com");
      SandboxSpec spec = SandboxSpec.image("docker.io/library/busybox:1.37");
      SandboxHandle sbx = sandboxes.getOrCreate(scope, spec); // racing harnesses: one Sandbox
      sbx.waitReady(120_000);
      try (Guard guard = sbx.guard(60_000L).acquire()) { // the scope's Lease
        ExecResult r = sbx.exec(ExecOptions.shell("ls; exit 3").timeout(Duration.ofSeconds(30))
            .env("FENCE", Integer.toString(guard.fencingToken()))); // for writes elsewhere
        assert r.exitCode() == 3; // the real exit code
        sbx.write("notes/todo.txt", "ship it\n".getBytes(StandardCharsets.UTF_8)); // confined
        try (Session session = sbx.session()) { // a persistent shell
          return session.run("cat notes/*").stdoutText();
        }
      }
    }
  }
}
