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
import java.util.concurrent.CyclicBarrier;
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
 * waiter's next poll: 1-3 hand-overs in 40 turns; with a 100 ms yield, a hand-over was lost
 * whenever the waiter reacted more slowly than that. The figures: at least 35 hand-overs of
 * 40, no wait longer than two turns, and the exact count. A waiter waits for one turn of the
 * other's (the hand-over to it and its hold) and its own hand-over, so "one turn" is the longest
 * hold plus the longest hand-over of the run: on a loaded machine either stretches tenfold now and
 * then, and a wait behind that is no unfairness. A wait through a yield or a missed wake-up (1-2 s)
 * exceeds two turns; an overtaken waiter fails the count.
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

  /** One turn: the count it read (the order of the turns), who, its wait, its hold, when it took. */
  record Turn(int n, String who, long waitedNanos, long heldNanos, boolean first, long tookNanos) {}

  @Test
  void twoHarnessesBackToBackTakeTurns() throws Exception {
    KubernetesClient k = env.sandboxes.kube().client;
    k.configMaps().inNamespace(env.ns).resource(new ConfigMapBuilder()
        .withNewMetadata().withName("fair-counter").endMetadata()
        .withData(Map.of("n", "0")).build()).create();
    Scope scope = Scope.forSession("java-tests", env.ns + "-fair");
    ExecutorService pool = Executors.newFixedThreadPool(2);
    List<Future<List<Turn>>> harnesses = new ArrayList<>();
    // Both harnesses start asking at once, connected: a harness still opening its first
    // connection does not want the guard yet, and the other's turns meanwhile are not unfair.
    CyclicBarrier start = new CyclicBarrier(2);
    for (String who : List.of("a", "b")) {
      harnesses.add(pool.submit(() -> {
        k.configMaps().inNamespace(env.ns).withName("fair-counter").get();
        start.await(1, TimeUnit.MINUTES);
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
          turns.add(new Turn(n, who, took - asked, System.nanoTime() - took, i == 0, took));
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
    // The pace: the median time from one acquisition to the next (a hold and a hand-over).
    List<Long> gaps = new ArrayList<>();
    List<Long> handoff = new ArrayList<>();
    for (int i = 1; i < turns.size(); i++) {
      Turn p = turns.get(i - 1);
      Turn t = turns.get(i);
      gaps.add(t.tookNanos() - p.tookNanos());
      if (!p.who().equals(t.who())) {
        handoff.add(t.tookNanos() - p.tookNanos() - p.heldNanos());
      }
    }
    gaps.sort(null);
    handoff.sort(null);
    long pace = gaps.get(gaps.size() / 2);
    long turn = held.get(held.size() - 1) + (handoff.isEmpty() ? 0 : handoff.get(handoff.size() - 1));
    double ratio = (double) longest / turn;
    String count = k.configMaps().inNamespace(env.ns).withName("fair-counter").get().getData().get("n");
    System.out.printf("guard fairness (java): %d hand-overs in %d turns; longest wait %.1f ms (%.1f ms after each"
        + " harness's first turn) = %.2f turns of %.1f ms; hold p50 %.1f ms, max %.1f ms; one acquisition to"
        + " the next p50 %.1f ms; hand-over p50 %.1f ms, max %.1f ms; counter %s; order %s%n", handOvers,
        turns.size(), longest / 1e6, steady / 1e6, ratio, turn / 1e6, held.get(held.size() / 2) / 1e6,
        held.get(held.size() - 1) / 1e6, pace / 1e6,
        handoff.isEmpty() ? 0 : handoff.get(handoff.size() / 2) / 1e6,
        handoff.isEmpty() ? 0 : handoff.get(handoff.size() - 1) / 1e6, count, order);
    assertEquals("40", count, "a lost update");
    // An unfair guard gave 1-3 hand-overs; 39 is every one there can be.
    assertTrue(handOvers >= 35, "only " + handOvers + " hand-overs in 40 turns");
    assertTrue(ratio <= 2, String.format("a wait of %.2f turns: someone was overtaken or the guard stood free", ratio));
  }
}
