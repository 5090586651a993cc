// Package cluster holds the Go client's tests on the real cluster (hack/cluster up, then
// `eval "$(hack/cluster env)"`). They fail, never skip, when the cluster is absent. As
// python/tests/integration/conftest.py does it: the package makes its own namespace and
// starts its own operator (the debug build of agentbox-operator) watching only that
// namespace, with a file:// snapshot store, and removes everything at the end.
package cluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	agentbox "agentbox.dev/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"
)

const (
	baseImage = "docker.io/library/busybox:1.37"
	storeRoot = "/var/lib/agentbox/test-snapshots"
	nodeRoot  = "/var/lib/agentbox/workspaces"
)

var (
	repo      = func() string { p, _ := filepath.Abs("../../.."); return p }()
	ns        string
	client    *agentbox.Client
	sandboxes *agentbox.Sandboxes
	dyn       dynamic.Interface
	opLog     string
)

var (
	crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	nsGVR  = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
	saGVR  = schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}
	podGVR = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	sbxGVR = schema.GroupVersionResource{Group: agentbox.Group, Version: agentbox.Version, Resource: "sandboxes"}
	snpGVR = schema.GroupVersionResource{Group: agentbox.Group, Version: agentbox.Version, Resource: "sandboxsnapshots"}
	lseGVR = schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}
)

func operatorBin() string {
	if p := os.Getenv("AGENTBOX_OPERATOR_BIN"); p != "" {
		return p
	}
	target := os.Getenv("CARGO_TARGET_DIR")
	if target == "" {
		cache := os.Getenv("AGENTBOX_CACHE")
		if cache == "" {
			home, _ := os.UserHomeDir()
			cache = filepath.Join(home, ".cache", "agentbox")
		}
		target = filepath.Join(cache, "target")
	}
	return filepath.Join(target, "debug", "agentbox-operator")
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Getenv("KUBECONFIG") == "" {
		fmt.Fprintln(os.Stderr, `no cluster: run eval "$(hack/cluster env)" or use hack/test`)
		return 1
	}
	bin := operatorBin()
	if _, err := os.Stat(bin); err != nil {
		fmt.Fprintf(os.Stderr, "%s is missing: run `cargo build --bin agentbox-operator` (hack/test does) or set $AGENTBOX_OPERATOR_BIN\n", bin)
		return 1
	}
	cfg, _, err := agentbox.LoadConfig()
	if err == nil {
		client, err = agentbox.NewClient(cfg)
	}
	if err == nil {
		dyn, err = dynamic.NewForConfig(client.Config)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx := context.Background()
	if err := ensureCRDs(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "CRDs:", err)
		return 1
	}
	var b [3]byte
	_, _ = rand.Read(b[:])
	ns = "go-cluster-" + hex.EncodeToString(b[:])
	if _, err := dyn.Resource(nsGVR).Create(ctx, &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns}}}, metav1.CreateOptions{}); err != nil {
		fmt.Fprintln(os.Stderr, "namespace:", err)
		return 1
	}
	store := filepath.Join(storeRoot, ns)
	defer teardown(store)
	// Pods need the namespace's default ServiceAccount, made by the controller-manager.
	for i := 0; i < 100; i++ {
		if _, err := dyn.Resource(saGVR).Namespace(ns).Get(ctx, "default", metav1.GetOptions{}); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	sandboxes = client.Sandboxes(ns)
	op, err := startOperator(bin, store)
	if err != nil {
		fmt.Fprintln(os.Stderr, "operator:", err)
		return 1
	}
	defer stopOperator(op)
	code := m.Run()
	// While the operator still runs (its finalizers clean pods and workspaces up).
	if err := cleanObjects(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "cleanup:", err)
	}
	if code != 0 {
		fmt.Fprintf(os.Stderr, "--- operator log (tail) ---\n%s\n", tail(opLog, 5))
	}
	return code
}

func ensureCRDs(ctx context.Context) error {
	raw, err := os.ReadFile(filepath.Join(repo, "crds", "agentbox.yaml"))
	if err != nil {
		return err
	}
	for _, doc := range strings.Split(string(raw), "\n---") {
		if strings.TrimSpace(strings.TrimPrefix(doc, "---")) == "" {
			continue
		}
		js, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			return err
		}
		var obj unstructured.Unstructured
		if err := obj.UnmarshalJSON(js); err != nil {
			return err
		}
		force := true
		if _, err := dyn.Resource(crdGVR).Patch(ctx, obj.GetName(), types.ApplyPatchType, js, metav1.PatchOptions{FieldManager: "agentbox-tests", Force: &force}); err != nil {
			return err
		}
		for i := 0; i < 300; i++ {
			got, err := dyn.Resource(crdGVR).Get(ctx, obj.GetName(), metav1.GetOptions{})
			if err == nil && established(got.Object) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

func established(o map[string]any) bool {
	st, _ := o["status"].(map[string]any)
	conds, _ := st["conditions"].([]any)
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}

func startOperator(bin, store string) (*exec.Cmd, error) {
	f, err := os.CreateTemp("", "agentbox-go-"+ns+"-*.log")
	if err != nil {
		return nil, err
	}
	opLog = f.Name()
	helper := os.Getenv("AGENTBOX_HELPER_IMAGE")
	if helper == "" {
		helper = "docker.io/agentbox/helper:dev"
	}
	rustLog := os.Getenv("RUST_LOG")
	if rustLog == "" {
		rustLog = "info,agentbox=debug"
	}
	cmd := exec.Command(bin, "--namespace", ns, "--identity", "op-"+ns, "--metrics-addr", fmt.Sprintf("127.0.0.1:%d", freePort()),
		"--lease-seconds", "10", "--store-url", "file://"+store, "--store-prefix", "snaps")
	cmd.Stdout, cmd.Stderr = f, f
	// Should this test binary die (a -timeout panic), its operator goes with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	cmd.Env = append(os.Environ(), "RUST_LOG="+rustLog, "AGENTBOX_HELPER_IMAGE="+helper)
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, err
	}
	f.Close()
	return cmd, nil
}

// stopOperator: SIGTERM, then SIGKILL after 10 s; by its PID only.
func stopOperator(cmd *exec.Cmd) {
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// teardown (after the operator stopped) strips what is left of finalizers, so the namespace
// never stays Terminating, and deletes the namespace and the store directory.
func teardown(store string) {
	ctx := context.Background()
	for _, gvr := range []schema.GroupVersionResource{snpGVR, sbxGVR} {
		list, err := dyn.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			continue
		}
		for _, it := range list.Items {
			_, _ = dyn.Resource(gvr).Namespace(ns).Patch(ctx, it.GetName(), types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
		}
	}
	_ = dyn.Resource(nsGVR).Delete(ctx, ns, metav1.DeleteOptions{})
	_ = os.RemoveAll(store)
	_ = os.RemoveAll(filepath.Join(nodeRoot, ns))
	_ = os.Remove(opLog)
}

// cleanObjects deletes every SandboxSnapshot and Sandbox and waits until they are gone.
func cleanObjects(ctx context.Context) error {
	for _, gvr := range []schema.GroupVersionResource{snpGVR, sbxGVR} {
		_ = dyn.Resource(gvr).Namespace(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	}
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		left := 0
		for _, gvr := range []schema.GroupVersionResource{snpGVR, sbxGVR} {
			l, err := dyn.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{})
			if err == nil {
				left += len(l.Items)
			}
		}
		if left == 0 {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("objects left after 3 minutes")
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(string(bytes.TrimRight(b, "\n")), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func unstructuredOf(obj map[string]any) *unstructured.Unstructured {
	o := map[string]any{}
	for k, v := range obj {
		if k != "status" {
			o[k] = v
		}
	}
	return &unstructured.Unstructured{Object: o}
}
