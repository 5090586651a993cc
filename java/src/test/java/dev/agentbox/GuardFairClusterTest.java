package dev.agentbox;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fabric8.kubernetes.api.model.ConfigMap;
import io.fabric8.kubernetes.api.model.ConfigMapBuilder;
import io.fabric8.kubernetes.client.KubernetesClient;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;
import org.junit.jupiter.api.Timeout;

/**
 * Issue 42, finding 3: two harnesses take one scope's guard back to back, 20 turns each (take it,
 * read a counter from a ConfigMap, write it back incremented with an unconditioned patch,
 * release, want it again at once). Before the queue slot the releaser took it again ahead of the
 * waiter's next poll: 1-3 hand-overs in 40 turns.
 */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
@Timeout(value = 3, unit = TimeUnit.MINUTES)
class GuardFairClusterTest {
  ClusterEnv env;

  @BeforeAll
  void setUp() {
    env = new ClusterEnv("guard-fair");
  }

  @AfterAll
  void tearDown() {
    if (env != null) {
      env.close();
    }
  }

  /** One turn: the count it read (the order of the turns), who, its wait and its hold. */
  record Turn(int n, String who, long waitedNanos, long heldNanos, boolean first) {}

  @Test
  void twoHarnessesBackToBackTakeTurns() throws Exception {
    KubernetesClient k = env.sandboxes.kube().client;
    k.configMaps().inNamespace(env.ns).resource(new ConfigMapBuilder()
        .withNewMetadata().withName("fair-counter").endMetadata()
        .withData(Map.of("n", "0")).build()).create();
    Scope scope = Scope.forSession("java-tests", env.ns + "-fair");
    ExecutorService pool = Executors.newFixedThreadPool(2);
    List<Future<List<Turn>>> harnesses = new ArrayList<>();
    for (String who : List.of("a", "b")) {
      harnesses.add(pool.submit(() -> {
        // The defaults a harness gets (a 15 s lease, 200 ms polls before the hand-off).
        GuardConfig cfg = GuardConfig.defaults().withHolder("harness-" + who);
        List<Turn> turns = new ArrayList<>();
        for (int i = 0; i < 20; i++) {
          long asked = System.nanoTime();
          Guard g = env.sandboxes.guard(scope, 60_000L, cfg).acquire();
          long took = System.nanoTime();
          ConfigMap cm = k.configMaps().inNamespace(env.ns).withName("fair-counter").get();
          int n = Integer.parseInt(cm.getData().get("n"));
          // Unconditioned: only the guard keeps the count exact.
          k.configMaps().inNamespace(env.ns).withName("fair-counter")
              .patch("{\"data\":{\"n\":\"" + (n + 1) + "\"}}");
          g.release();
          turns.add(new Turn(n, who, took - asked, System.nanoTime() - took, i == 0));
        }
        return turns;
      }));
    }
    List<Turn> turns = new ArrayList<>();
    for (Future<List<Turn>> h : harnesses) {
      turns.addAll(h.get(2, TimeUnit.MINUTES));
    }
    pool.shutdown();
    turns.sort(Comparator.comparingInt(Turn::n));
    int handOvers = 0;
    long longest = 0;
    long steady = 0;
    StringBuilder order = new StringBuilder();
    List<Long> held = new ArrayList<>();
    for (int i = 0; i < turns.size(); i++) {
      Turn t = turns.get(i);
      if (i > 0 && !turns.get(i - 1).who().equals(t.who())) {
        handOvers++;
      }
      longest = Math.max(longest, t.waitedNanos());
      if (!t.first()) {
        steady = Math.max(steady, t.waitedNanos());
      }
      held.add(t.heldNanos());
      order.append(t.who());
    }
    held.sort(null);
    String count = k.configMaps().inNamespace(env.ns).withName("fair-counter").get().getData().get("n");
    System.out.printf("guard fairness (java): %d hand-overs in %d turns; longest wait %.1f ms (%.1f ms after each"
        + " harness's first turn); turn p50 %.1f ms, max %.1f ms; counter %s; order %s%n", handOvers, turns.size(),
        longest / 1e6, steady / 1e6,
        held.get(held.size() / 2) / 1e6, held.get(held.size() - 1) / 1e6, count, order);
    assertEquals("40", count, "a lost update");
    assertTrue(handOvers >= 25, "only " + handOvers + " hand-overs in 40 turns");
  }
}
