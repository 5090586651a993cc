// Command agentbox-go-bench measures the Go client's exec latency on a cluster, as
// benches/exec.rs does Rust's: one-shot `true` and the persistent session's per-command
// `true`, against one bare pod (container "sandbox").
//
//	agentbox-go-bench [-n N]                          a pod in a temporary namespace of its own;
//	                                                  prints p50/p95 (and appends JSON lines to
//	                                                  $BENCH_RESULTS when set)
//	agentbox-go-bench oneshot NAMESPACE POD CONTAINER N   one JSON line of samples (ms), with
//	agentbox-go-bench session NAMESPACE POD CONTAINER N   the arguments and output of
//	                                                      benches/sdk_python.py (CONTAINER:
//	                                                      sandbox)
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"time"

	agentbox "agentbox.dev/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

var (
	nsGVR  = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
	podGVR = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "agentbox-go-bench:", err)
		os.Exit(1)
	}
}

func run() error {
	n := flag.Int("n", 200, "samples of each figure")
	flag.Parse()
	cfg, _, err := agentbox.LoadConfig()
	if err != nil {
		return err
	}
	c, err := agentbox.NewClient(cfg)
	if err != nil {
		return err
	}
	ctx := context.Background()
	if args := flag.Args(); len(args) > 0 {
		if len(args) != 5 || args[3] != agentbox.SandboxContainer {
			return fmt.Errorf("usage: %s oneshot|session NAMESPACE POD %s N", os.Args[0], agentbox.SandboxContainer)
		}
		k, err := strconv.Atoi(args[4])
		if err != nil {
			return err
		}
		var key string
		var samples []float64
		switch args[0] {
		case "oneshot":
			key = "oneshot_ms"
			samples, err = oneshot(ctx, c.Pod(args[1], args[2], "/"), k)
		case "session":
			key = "session_ms"
			samples, err = session(ctx, c.Pod(args[1], args[2], "/"), k)
		default:
			return fmt.Errorf("unknown figure %q", args[0])
		}
		if err != nil {
			return err
		}
		return json.NewEncoder(os.Stdout).Encode(map[string]any{key: samples})
	}
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	var b [3]byte
	_, _ = rand.Read(b[:])
	ns := "bench-go-" + hex.EncodeToString(b[:])
	if _, err := dyn.Resource(nsGVR).Create(ctx, &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns}}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	defer func() { _ = dyn.Resource(nsGVR).Delete(context.Background(), ns, metav1.DeleteOptions{}) }()
	if err := startPod(ctx, dyn, ns); err != nil {
		return err
	}
	pod := c.Pod(ns, "box", "/")
	one, err := oneshot(ctx, pod, *n)
	if err != nil {
		return err
	}
	ses, err := session(ctx, pod, *n)
	if err != nil {
		return err
	}
	p50, p95 := pct(one)
	s50, s95 := pct(ses)
	fmt.Printf("go one-shot exec `true`:      p50 %.1f ms  p95 %.1f ms  (n=%d)\n", p50, p95, *n)
	fmt.Printf("go session command `true`:    p50 %.2f ms  p95 %.2f ms  (n=%d)\n", s50, s95, *n)
	emit("exec", "oneshot_go_sdk_p50_ms", p50, *n)
	emit("exec", "oneshot_go_sdk_p95_ms", p95, *n)
	emit("exec", "session_go_sdk_p50_ms", s50, *n)
	return nil
}

func startPod(ctx context.Context, dyn dynamic.Interface, ns string) error {
	pod := map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": "box"},
		"spec": map[string]any{
			"automountServiceAccountToken":  false,
			"terminationGracePeriodSeconds": int64(1),
			"containers": []any{map[string]any{
				"name": agentbox.SandboxContainer, "image": "docker.io/library/busybox:1.37",
				"imagePullPolicy": "Never", "command": []any{"sleep", "3600"},
			}},
		},
	}
	// The namespace's default ServiceAccount comes from the controller-manager.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		_, err := dyn.Resource(podGVR).Namespace(ns).Create(ctx, &unstructured.Unstructured{Object: pod}, metav1.CreateOptions{})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
	for time.Now().Before(deadline) {
		u, err := dyn.Resource(podGVR).Namespace(ns).Get(ctx, "box", metav1.GetOptions{})
		if err == nil {
			if phase, _, _ := unstructured.NestedString(u.Object, "status", "phase"); phase == "Running" {
				return nil
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("the bench pod is not Running after 2 minutes")
}

func timed(n, warmup int, once func() error) ([]float64, error) {
	for i := 0; i < warmup; i++ {
		if err := once(); err != nil {
			return nil, err
		}
	}
	out := make([]float64, 0, n)
	for i := 0; i < n; i++ {
		t := time.Now()
		if err := once(); err != nil {
			return nil, err
		}
		out = append(out, float64(time.Since(t).Microseconds())/1000)
	}
	return out, nil
}

func oneshot(ctx context.Context, pod *agentbox.Sandbox, n int) ([]float64, error) {
	return timed(n, 5, func() error {
		r, err := pod.Exec(ctx, []string{"true"}, agentbox.ExecOptions{})
		if err == nil && !r.OK() {
			err = fmt.Errorf("true failed: %+v", r)
		}
		return err
	})
}

func session(ctx context.Context, pod *agentbox.Sandbox, n int) ([]float64, error) {
	s := pod.Session("/")
	defer s.Close()
	return timed(n, 20, func() error {
		r, err := s.Exec(ctx, []string{"true"}, agentbox.ExecOptions{})
		if err == nil && !r.OK() {
			err = fmt.Errorf("true failed: %+v", r)
		}
		return err
	})
}

// pct is (p50, p95), nearest rank, as benches/common's p50_p95.
func pct(v []float64) (float64, float64) {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	pick := func(q float64) float64 { return s[int(math.Round(float64(len(s)-1)*q))] }
	return pick(0.5), pick(0.95)
}

func emit(bench, key string, value float64, n int) {
	path := os.Getenv("BENCH_RESULTS")
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, "BENCH_RESULTS:", err)
		return
	}
	defer f.Close()
	_ = json.NewEncoder(f).Encode(map[string]any{"bench": bench, "key": key, "value": value, "unit": "ms", "n": n})
}
