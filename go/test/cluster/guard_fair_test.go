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
}

// Issue 42, finding 3: two harnesses take one scope's guard back to back, 20 turns each (take
// it, read a counter from a ConfigMap, write it back incremented with an unconditioned patch,
// release, want it again at once). Before the queue slot the releaser took it again ahead of
// the waiter's next poll: 1-3 hand-overs in 40 turns.
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
	for _, who := range []string{"a", "b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
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
				turns = append(turns, fairTurn{n: n, who: who, first: i == 0, waited: took.Sub(asked), held: time.Since(took)})
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
	cur, err := cms.Get(ctx, "fair-counter", metav1.GetOptions{})
	must(t, err)
	count, _, _ := unstructured.NestedString(cur.Object, "data", "n")
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	t.Logf("guard fairness (go): %d hand-overs in %d turns; longest wait %.1f ms (%.1f ms after each harness's first turn); turn p50 %.1f ms, max %.1f ms; counter %s; order %s",
		handOvers, len(turns), ms(longest), ms(steady), ms(held[len(held)/2]), ms(held[len(held)-1]), count, order)
	if count != "40" {
		t.Fatalf("counter %s after 40 turns: a lost update", count)
	}
	if handOvers < 25 {
		t.Fatalf("only %d hand-overs in 40 turns: the releaser took the guard again ahead of the waiter", handOvers)
	}
}
