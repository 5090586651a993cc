package cluster

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	agentbox "agentbox.dev/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

var cmGVR = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

// fairTurn is one turn of a harness: the count it read (the order of the turns), who, how long it
// waited for the guard and how long it then held it.
type fairTurn struct {
	n            int
	who          string
	first        bool // its harness's first turn (its wait includes the first connections)
	waited, held time.Duration
	took         time.Time // when it got the guard
}

// Issue 42, finding 3: two harnesses take one scope's guard back to back, 20 turns each (take
// it, read a counter from a ConfigMap, write it back incremented with an unconditioned patch,
// release, want it again at once). Before the queue slot the releaser took it again ahead of
// the waiter's next poll: 1-3 hand-overs in 40 turns; with a 100 ms yield, a hand-over was lost
// whenever the waiter reacted more slowly than that. The figures: at least 35 hand-overs
// of 40, no wait longer than two turns, and the exact count. A waiter waits for one turn of the
// other's (the hand-over to it and its hold) and its own hand-over, so "one turn" is the longest
// hold plus the longest hand-over of the run: on a loaded machine either stretches tenfold now
// and then, and a wait behind that is no unfairness. A wait through a yield or a missed wake-up
// (1-2 s) exceeds two turns; an overtaken waiter fails the count.
func TestGuardTwoHarnessesBackToBackTakeTurns(t *testing.T) {
	ctx := context.Background()
	cms := dyn.Resource(cmGVR).Namespace(ns)
	cm := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "fair-counter"},
		"data":     map[string]any{"n": "0"},
	}}
	_, err := cms.Create(ctx, cm, metav1.CreateOptions{})
	must(t, err)
	scope := agentbox.SessionScope("go-tests", ns+"-fair")
	var mu sync.Mutex
	var turns []fairTurn
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	// Both harnesses start asking at once, connected: a harness still opening its first
	// connection does not want the guard yet, and the other's turns meanwhile are not unfair.
	var ready sync.WaitGroup
	ready.Add(2)
	start := make(chan struct{})
	go func() { ready.Wait(); close(start) }()
	for _, who := range []string{"a", "b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := cms.Get(ctx, "fair-counter", metav1.GetOptions{})
			ready.Done()
			if err != nil {
				errs <- err
				return
			}
			<-start
			// The defaults a harness gets (a 15 s lease, 200 ms polls before the hand-off).
			cfg := agentbox.GuardConfig{Holder: "harness-" + who, Wait: time.Minute}
			for i := range 20 {
				asked := time.Now()
				g := sandboxes.Guard(scope, cfg)
				if err := g.Acquire(ctx); err != nil {
					errs <- err
					return
				}
				took := time.Now()
				cur, err := cms.Get(ctx, "fair-counter", metav1.GetOptions{})
				if err != nil {
					errs <- err
					return
				}
				s, _, _ := unstructured.NestedString(cur.Object, "data", "n")
				n, _ := strconv.Atoi(s)
				// Unconditioned: only the guard keeps the count exact.
				patch := fmt.Appendf(nil, `{"data":{"n":"%d"}}`, n+1)
				if _, err := cms.Patch(ctx, "fair-counter", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
					errs <- err
					return
				}
				if err := g.Release(ctx); err != nil {
					errs <- err
					return
				}
				mu.Lock()
				turns = append(turns, fairTurn{n: n, who: who, first: i == 0, waited: took.Sub(asked), held: time.Since(took), took: took})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	slices.SortFunc(turns, func(x, y fairTurn) int { return x.n - y.n })
	handOvers, longest, steady, order := 0, time.Duration(0), time.Duration(0), ""
	held := make([]time.Duration, 0, len(turns))
	for i, x := range turns {
		if i > 0 && turns[i-1].who != x.who {
			handOvers++
		}
		longest = max(longest, x.waited)
		if !x.first {
			steady = max(steady, x.waited)
		}
		held = append(held, x.held)
		order += x.who
	}
	slices.Sort(held)
	// The pace: the median time from one acquisition to the next (a hold and a hand-over).
	gaps := make([]time.Duration, 0, len(turns))
	handoff := make([]time.Duration, 0, len(turns))
	for i := 1; i < len(turns); i++ {
		gaps = append(gaps, turns[i].took.Sub(turns[i-1].took))
		if turns[i].who != turns[i-1].who {
			handoff = append(handoff, turns[i].took.Sub(turns[i-1].took.Add(turns[i-1].held)))
		}
	}
	slices.Sort(gaps)
	slices.Sort(handoff)
	pace, turn := gaps[len(gaps)/2], held[len(held)-1]
	if len(handoff) > 0 {
		turn += handoff[len(handoff)-1]
	}
	ratio := float64(longest) / float64(turn)
	cur, err := cms.Get(ctx, "fair-counter", metav1.GetOptions{})
	must(t, err)
	count, _, _ := unstructured.NestedString(cur.Object, "data", "n")
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	hp50, hmax := 0.0, 0.0
	if len(handoff) > 0 {
		hp50, hmax = ms(handoff[len(handoff)/2]), ms(handoff[len(handoff)-1])
	}
	t.Logf("guard fairness (go): %d hand-overs in %d turns; longest wait %.1f ms (%.1f ms after each harness's first turn) = %.2f turns of %.1f ms; hold p50 %.1f ms, max %.1f ms; one acquisition to the next p50 %.1f ms; hand-over p50 %.1f ms, max %.1f ms; counter %s; order %s",
		handOvers, len(turns), ms(longest), ms(steady), ratio, ms(turn), ms(held[len(held)/2]), ms(held[len(held)-1]), ms(pace), hp50, hmax, count, order)
	if count != "40" {
		t.Fatalf("counter %s after 40 turns: a lost update", count)
	}
	// An unfair guard gave 1-3 hand-overs; 39 is every one there can be.
	if handOvers < 35 {
		t.Fatalf("only %d hand-overs in 40 turns: the releaser took the guard again ahead of the waiter", handOvers)
	}
	if ratio > 2 {
		t.Fatalf("a wait of %.2f turns: someone was overtaken or the guard stood free", ratio)
	}
}
