package cluster

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	agentbox "agentbox.dev/go"
	"agentbox.dev/go/anna"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

func factory(id string, guardWait time.Duration) *anna.Agentbox {
	return &anna.Agentbox{
		Sandboxes:       sandboxes,
		Scope:           agentbox.UserScope("go-anna", ns+"-"+id),
		Image:           baseImage,
		ImagePullPolicy: "Never",
		Guard:           agentbox.GuardConfig{LeaseDuration: 5 * time.Second, Wait: guardWait},
	}
}

// A small runner: a session from a Policy, commands, a line-echo process, files both ways,
// Done when the pod goes, and the workspace found again by the next session.
func TestAnnaRunner(t *testing.T) {
	ctx := context.Background()
	f := factory("runner", 30*time.Second)
	if !f.Available() {
		t.Fatal("the factory is not available on the cluster")
	}
	var factoryIface anna.Factory = f
	policy := anna.Policy{
		Filesystem: anna.FilesystemPolicy{WorkingDir: "proj"},
		Network:    anna.NetworkPolicy{Mode: anna.NetworkDisabled},
		Env:        map[string]string{"RUN": "r1"},
		Timeout:    time.Minute,
	}
	s, err := factoryIface.CreateSession(ctx, policy)
	if err != nil {
		t.Fatalf("%v\n%s", err, tail(opLog, 40))
	}
	defer s.Close()
	if s.WorkingDir() != "/workspace/proj" || !s.Alive() || s.Policy().Env["RUN"] != "r1" {
		t.Fatalf("session %s %v", s.WorkingDir(), s.Alive())
	}
	r, err := s.Exec(ctx, `echo "$RUN $X"; pwd; exit 4`, anna.ExecOptions{Env: map[string]string{"X": "x"}})
	if err != nil || r.ExitCode != 4 || r.Stdout != "r1 x\n/workspace/proj\n" {
		t.Fatalf("exec %+v %v", r, err)
	}
	r, err = s.Exec(ctx, "pwd", anna.ExecOptions{Cwd: "/workspace"})
	if err != nil || r.Stdout != "/workspace\n" {
		t.Fatalf("cwd %+v %v", r, err)
	}
	r, err = s.Exec(ctx, "sleep 30", anna.ExecOptions{Timeout: 500 * time.Millisecond})
	if !errors.Is(err, agentbox.ErrExecTimeout) || r.ExitCode != 137 {
		t.Fatalf("timeout %+v %v", r, err)
	}
	s.(anna.EnvRefresher).RefreshEnv(map[string]string{"RUN": "r2"})
	if r, err := s.Exec(ctx, `echo "$RUN"`, anna.ExecOptions{}); err != nil || r.Stdout != "r2\n" {
		t.Fatalf("refreshed env %+v %v", r, err)
	}

	// A long-lived line-echo process over StartProcess (how stdio MCP servers run).
	p, err := s.StartProcess(ctx, anna.ProcessRequest{Path: "sh", Args: []string{"-c", `while read -r l; do echo "echo:$l"; done; echo bye >&2`}})
	if err != nil {
		t.Fatal(err)
	}
	if pid := p.PID(); pid <= 1 {
		t.Fatalf("pid %d", pid)
	}
	lines := bufio.NewReader(p.Stdout())
	for _, msg := range []string{"one", "two", `{"jsonrpc":"2.0"}`} {
		if _, err := io.WriteString(p.Stdin(), msg+"\n"); err != nil {
			t.Fatal(err)
		}
		got, err := lines.ReadString('\n')
		if err != nil || got != "echo:"+msg+"\n" {
			t.Fatalf("echo of %q: %q %v", msg, got, err)
		}
	}
	errOut := make(chan string, 1)
	go func() { b, _ := io.ReadAll(p.Stderr()); errOut <- string(b) }()
	must(t, p.Stdin().Close())
	if rest, _ := io.ReadAll(lines); len(rest) != 0 {
		t.Fatalf("more output: %q", rest)
	}
	if res, err := p.Wait(ctx); err != nil || res.ExitCode != 0 {
		t.Fatalf("process end %+v %v", res, err)
	}
	if e := <-errOut; e != "bye\n" {
		t.Fatalf("stderr %q", e)
	}

	// Files both ways: through Files() (no type assertion), and FS() for the rest.
	files := s.Files()
	must(t, files.WriteFile("notes/a.txt", []byte("from the runner"), 0o640))
	if r, err := s.Exec(ctx, "cat notes/a.txt; stat -c %a notes/a.txt", anna.ExecOptions{}); err != nil || r.Stdout != "from the runner640\n" {
		t.Fatalf("written file in the pod: %+v %v", r, err)
	}
	if _, err := s.Exec(ctx, "mkdir -p out && echo made > out/b.txt", anna.ExecOptions{}); err != nil {
		t.Fatal(err)
	}
	if b, err := files.ReadFile("out/b.txt"); err != nil || string(b) != "made\n" {
		t.Fatalf("read %q %v", b, err)
	}
	info, err := files.Stat("notes/a.txt")
	if err != nil || info.Size != 15 || info.IsDir {
		t.Fatalf("stat %v %v", info, err)
	}
	entries, err := files.ReadDir(".")
	if err != nil || len(entries) != 2 || entries[0].Name != "notes" || !entries[0].IsDir {
		t.Fatalf("readdir %v %v", entries, err)
	}
	if _, err := files.ReadFile("missing"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing: %v", err)
	}
	if _, err := files.ReadFile("../../etc/passwd"); !errors.Is(err, agentbox.ErrPath) {
		t.Fatalf("dotdot: %v", err)
	}
	must(t, files.ProjectFiles("proj-files", []anna.ProjectedFile{{Path: "x/y.txt", Content: []byte("y"), Mode: 0o600}}))
	must(t, files.ProjectFiles("proj-files", []anna.ProjectedFile{{Path: "x/y.txt", Content: []byte("y"), Mode: 0o600}}))
	if err := files.ProjectFiles("proj-files", []anna.ProjectedFile{{Path: "x/y.txt", Content: []byte("z"), Mode: 0o600}}); !errors.Is(err, anna.ErrProjectionConflict) {
		t.Fatalf("projection conflict: %v", err)
	}
	fsys := s.(*anna.AgentboxSession).FS()
	must(t, fsys.Mkdir("made/deep"))
	if st, err := fsys.Stat("made/deep"); err != nil || !st.IsDir {
		t.Fatalf("mkdir: %v %v", st, err)
	}
	must(t, fsys.RemoveAll("made"))
	must(t, fsys.Remove("proj-files/x/y.txt"))
	if _, err := fsys.Stat("made"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("removed: %v", err)
	}

	// ResolvePath: this test runs on the cluster's one node, so the workspace is here.
	as := s.(*anna.AgentboxSession)
	host, err := as.ResolvePath("out/b.txt")
	if err != nil {
		t.Fatalf("ResolvePath on the node: %v", err)
	}
	if b, err := os.ReadFile(host); err != nil || string(b) != "made\n" {
		t.Fatalf("host read %s: %q %v", host, b, err)
	}
	must(t, os.WriteFile(host, []byte("host"), 0o644))
	if r, err := s.Exec(ctx, "cat out/b.txt", anna.ExecOptions{}); err != nil || r.Stdout != "host" {
		t.Fatalf("host-written file: %+v %v", r, err)
	}
	if _, err := as.ResolvePath("../../x"); !errors.Is(err, agentbox.ErrPath) {
		t.Fatalf("ResolvePath dotdot: %v", err)
	}
	if _, err := as.ResolvePath("from-host.txt"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("ResolvePath of a missing file: %v", err)
	}

	// Done closes when the pod goes away.
	sbx, err := sandboxes.OpenScope(ctx, f.Scope)
	must(t, err)
	must(t, dyn.Resource(podGVR).Namespace(ns).Delete(ctx, sbx.PodName(), metav1.DeleteOptions{}))
	select {
	case <-s.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("Done did not close after the pod was deleted")
	}
	if s.Alive() {
		t.Fatal("alive after Done")
	}
	if _, err := s.Exec(ctx, "true", anna.ExecOptions{}); !errors.Is(err, anna.ErrClosed) {
		t.Fatalf("exec after the end: %v", err)
	}
	must(t, s.Close())

	// A new session of the scope finds the workspace again (in the pod the operator starts
	// anew).
	s2, err := f.CreateSession(ctx, policy)
	if err != nil {
		t.Fatalf("%v\n%s", err, tail(opLog, 40))
	}
	defer s2.Close()
	r, err = s2.Exec(ctx, "cat notes/a.txt out/b.txt", anna.ExecOptions{})
	if err != nil || r.Stdout != "from the runnerhost" {
		t.Fatalf("resumed workspace: %+v %v", r, err)
	}
}

// A symlink made in the sandbox does not lead ResolvePath out of the workspace: `ln -s /etc
// esc` (and a relative ../../.. link, and a link to one file) are refused, where a host path
// through them used to read the node's /etc/passwd.
func TestAnnaResolvePathRefusesSymlinksOutOfTheWorkspace(t *testing.T) {
	ctx := context.Background()
	s, err := factory("resolve", 30*time.Second).Open(ctx, anna.Policy{})
	if err != nil {
		t.Fatalf("%v\n%s", err, tail(opLog, 40))
	}
	defer s.Close()
	if _, err := s.Exec(ctx, "ln -s /etc esc && ln -s ../../../../../../../../etc up && ln -s /etc/passwd pw && mkdir d && ln -s /etc d/mid && echo ok > f", anna.ExecOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"esc/passwd", "esc/hostname", "up/passwd", "pw", "d/mid/passwd", "esc"} {
		host, err := s.ResolvePath(p)
		if err == nil {
			b, _ := os.ReadFile(host)
			t.Errorf("%s resolved to %s (%d bytes readable)", p, host, len(b))
		} else if !errors.Is(err, agentbox.ErrPath) {
			t.Errorf("%s: %v", p, err)
		}
	}
	host, err := s.ResolvePath("f")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(host); err != nil || string(b) != "ok\n" {
		t.Fatalf("%q %v", b, err)
	}
}

// liveIn lists the processes of the sandbox's pod whose command line has marker (not the
// scanning shell, nor the wrapper around it, whose arguments hold the marker).
func liveIn(t *testing.T, sbx *agentbox.Sandbox, marker string) string {
	t.Helper()
	r, err := sbx.Exec(context.Background(), []string{"sh", "-c", `for d in /proc/[0-9]*; do c=$(tr '\0' ' ' <"$d/cmdline" 2>/dev/null) || continue; case "$c" in *"$1"*) [ "${d#/proc/}" = $$ ] || [ "${d#/proc/}" = $PPID ] || echo "${d#/proc/} $c";; esac; done`, "live", marker}, agentbox.ExecOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return string(r.Stdout)
}

// Close of a process handle ends the process and its children in the pod (not only the
// connection), and the session's Close ends the processes it started, even ones that ignore
// the end of their stdin.
func TestAnnaProcessesEndWithCloseInThePod(t *testing.T) {
	ctx := context.Background()
	f := factory("kill", 30*time.Second)
	s, err := f.Open(ctx, anna.Policy{})
	if err != nil {
		t.Fatalf("%v\n%s", err, tail(opLog, 40))
	}
	defer s.Close()
	sbx := s.Sandbox()
	p, err := s.StartProcess(ctx, anna.ProcessRequest{Path: "sh", Args: []string{"-c", "sleep 1004 & setsid sleep 1014 & sleep 1024"}})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; !strings.Contains(liveIn(t, sbx, "sleep 10"), "sleep 1024"); i++ {
		if i > 100 {
			t.Fatal("the process did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if pid := p.PID(); pid <= 1 {
		t.Fatalf("pid %d", pid)
	}
	must(t, p.Close())
	if res, err := p.Wait(ctx); err != nil || res.ExitCode != 137 {
		t.Fatalf("killed: %+v %v", res, err)
	}
	if left := liveIn(t, sbx, "sleep 10"); left != "" {
		t.Fatalf("left running in the pod after Close:\n%s", left)
	}

	// A stdio server that ignores the end of its input, left to the session's Close.
	for _, arg := range []string{"1005", "1006"} {
		if _, err := s.StartProcess(ctx, anna.ProcessRequest{Path: "sh", Args: []string{"-c", "trap '' HUP TERM; sleep " + arg + " & while :; do sleep " + arg + "; done"}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; strings.Count(liveIn(t, sbx, "sleep 100"), "\n") < 2; i++ {
		if i > 100 {
			t.Fatal("the processes did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}
	must(t, s.Close())
	if left := liveIn(t, sbx, "sleep 100"); left != "" {
		t.Fatalf("left running in the pod after the session's Close:\n%s", left)
	}
}

// An output longer than the cap is an error the runner sees (with the output up to the cap),
// and the factory's MaxOutput raises the cap.
func TestAnnaOutputOverTheCapIsAnError(t *testing.T) {
	ctx := context.Background()
	f := factory("cap", 30*time.Second)
	s, err := f.Open(ctx, anna.Policy{})
	if err != nil {
		t.Fatalf("%v\n%s", err, tail(opLog, 40))
	}
	r, err := s.Exec(ctx, "head -c 9437184 /dev/zero", anna.ExecOptions{})
	var te *agentbox.OutputTruncatedError
	if !errors.Is(err, anna.ErrOutputTruncated) || !errors.As(err, &te) || len(r.Stdout) != 8<<20 || r.ExitCode != 0 {
		t.Fatalf("9 MiB under the 8 MiB cap: %d bytes, exit %d, %v", len(r.Stdout), r.ExitCode, err)
	}
	must(t, s.Close())
	f.MaxOutput = 16 << 20
	s, err = f.Open(ctx, anna.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r, err = s.Exec(ctx, "head -c 9437184 /dev/zero", anna.ExecOptions{})
	if err != nil || len(r.Stdout) != 9<<20 {
		t.Fatalf("9 MiB under a 16 MiB cap: %d bytes, %v", len(r.Stdout), err)
	}
}

// Two sessions on one scope exclude each other: the second waits for the first's guard and
// gives up at its wait; once the first closes, a new one starts.
func TestAnnaSessionsOfOneScopeExcludeEachOther(t *testing.T) {
	ctx := context.Background()
	a, err := factory("excl", 2*time.Second).CreateSession(ctx, anna.Policy{})
	if err != nil {
		t.Fatalf("%v\n%s", err, tail(opLog, 40))
	}
	_, err = factory("excl", 2*time.Second).CreateSession(ctx, anna.Policy{})
	if !errors.Is(err, agentbox.ErrGuardTimeout) {
		t.Fatalf("second session: %v", err)
	}
	must(t, a.Close())
	select {
	case <-a.Done():
	default:
		t.Fatal("Done open after Close")
	}
	b, err := factory("excl", 10*time.Second).CreateSession(ctx, anna.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	must(t, b.Close())
}

// A policy agentbox cannot honour stops the runner before anything is created.
func TestAnnaRefusesAPolicyItCannotHonour(t *testing.T) {
	ctx := context.Background()
	f := factory("refused", time.Second)
	_, err := f.CreateSession(ctx, anna.Policy{Network: anna.NetworkPolicy{Mode: "allowlist"}})
	var pe *anna.PolicyCompatibilityError
	if !errors.As(err, &pe) || !strings.HasPrefix(pe.Reason, "Policy.Network.Mode: ") {
		t.Fatalf("got %v", err)
	}
	if _, err := sandboxes.OpenScope(ctx, f.Scope); !errors.Is(err, agentbox.ErrNotFound) {
		t.Fatalf("a sandbox was made: %v", err)
	}
	// The scope's existing sandbox under another network policy is not silently reused.
	g := factory("refused2", 2*time.Second)
	s, err := g.CreateSession(ctx, anna.Policy{Network: anna.NetworkPolicy{Mode: anna.NetworkDisabled}})
	if err != nil {
		t.Fatal(err)
	}
	must(t, s.Close())
	if _, err := g.CreateSession(ctx, anna.Policy{Network: anna.NetworkPolicy{Mode: anna.NetworkAllowAll}}); !errors.As(err, &pe) || !strings.HasPrefix(pe.Reason, "Policy.Network.Mode: ") {
		t.Fatalf("reuse under another policy: %v", err)
	}
}

// A session whose guard is taken over ends: Done closes and commands fail.
func TestAnnaSessionEndsWhenItsGuardIsLost(t *testing.T) {
	ctx := context.Background()
	f := factory("lost", 10*time.Second)
	s, err := f.CreateSession(ctx, anna.Policy{})
	if err != nil {
		t.Fatalf("%v\n%s", err, tail(opLog, 40))
	}
	defer s.Close()
	name := agentbox.LeaseName(agentbox.ScopeKey(f.Scope))
	must(t, takeLease(ctx, name, "another-runner"))
	select {
	case <-s.Done():
	case <-time.After(15 * time.Second):
		t.Fatal("Done did not close after the guard was taken over")
	}
	if _, err := s.Exec(ctx, "true", anna.ExecOptions{}); !errors.Is(err, anna.ErrClosed) {
		t.Fatalf("exec after the guard was lost: %v", err)
	}
}

// Fail closed (issue 45): a session with the network disabled on a node where the operator
// finds NetworkPolicy not enforced is refused at once, naming the cause, not after the ready
// wait. The node is made to look unenforced from the operator's side only: a second operator
// watches a namespace of its own (its own check there), where a policy admits all egress of
// pods labelled as the check's canaries, so its canary is not confined.
func TestAnnaRefusesADisabledNetworkWhereItIsNotEnforced(t *testing.T) {
	ctx := context.Background()
	var b [3]byte
	_, _ = rand.Read(b[:])
	ns2 := "go-net-" + hex.EncodeToString(b[:])
	_, err := dyn.Resource(nsGVR).Create(ctx, &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns2}}}, metav1.CreateOptions{})
	must(t, err)
	// Last (after its operator stopped): the sandboxes' finalizers go, then the namespace.
	defer func() {
		ctx := context.Background()
		if l, err := dyn.Resource(sbxGVR).Namespace(ns2).List(ctx, metav1.ListOptions{}); err == nil {
			for _, it := range l.Items {
				_, _ = dyn.Resource(sbxGVR).Namespace(ns2).Patch(ctx, it.GetName(), types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
			}
		}
		_ = dyn.Resource(nsGVR).Delete(ctx, ns2, metav1.DeleteOptions{})
	}()
	for i := 0; i < 100; i++ {
		if _, err := dyn.Resource(saGVR).Namespace(ns2).Get(ctx, "default", metav1.GetOptions{}); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	npGVR := schema.GroupVersionResource{Group: "networking.k8s.io", Version: "v1", Resource: "networkpolicies"}
	_, err = dyn.Resource(npGVR).Namespace(ns2).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
		"metadata": map[string]any{"name": "tenant-allows-canaries"},
		"spec": map[string]any{
			"podSelector": map[string]any{"matchLabels": map[string]any{"agentbox.dev/netcheck": "canary"}},
			"policyTypes": []any{"Egress"}, "egress": []any{map[string]any{}},
		},
	}}, metav1.CreateOptions{})
	must(t, err)
	log, err := os.CreateTemp("", "agentbox-go-"+ns2+"-*.log")
	must(t, err)
	defer os.Remove(log.Name())
	op := exec.Command(operatorBin(), "--namespace", ns2, "--identity", "op-"+ns2, "--metrics-addr", fmt.Sprintf("127.0.0.1:%d", freePort()), "--lease-seconds", "10")
	op.Stdout, op.Stderr = log, log
	op.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	helper := os.Getenv("AGENTBOX_HELPER_IMAGE")
	if helper == "" {
		helper = "docker.io/agentbox/helper:dev"
	}
	op.Env = append(os.Environ(), "AGENTBOX_HELPER_IMAGE="+helper)
	must(t, op.Start())
	log.Close()
	defer stopOperator(op)
	f := &anna.Agentbox{
		Sandboxes:       client.Sandboxes(ns2),
		Scope:           agentbox.UserScope("go-anna", ns2),
		Image:           baseImage,
		ImagePullPolicy: "Never",
		ReadyTimeout:    3 * time.Minute,
		Guard:           agentbox.GuardConfig{LeaseDuration: 5 * time.Second, Wait: 10 * time.Second},
	}
	start := time.Now()
	s, err := f.CreateSession(ctx, anna.Policy{Network: anna.NetworkPolicy{Mode: anna.NetworkDisabled}})
	if err == nil {
		s.Close()
		t.Fatalf("a session with the network disabled where it is not enforced\n%s", tail(log.Name(), 30))
	}
	var pe *anna.PolicyCompatibilityError
	if !errors.As(err, &pe) || !strings.HasPrefix(pe.Reason, "Policy.Network.Mode: ") ||
		!strings.Contains(pe.Reason, "NetworkPolicyNotEnforced") || !strings.Contains(pe.Reason, "Install a network plugin") {
		t.Fatalf("got %v\n%s", err, tail(log.Name(), 30))
	}
	// At once, not at the end of the 3 minute wait (the check's own probes take about 15 s).
	if waited := time.Since(start); waited > 90*time.Second {
		t.Fatalf("refused after %v", waited)
	}
	// The same factory with the network allowed is served: the refusal was the network's.
	open := *f
	open.Scope = agentbox.UserScope("go-anna", ns2+"-open")
	s, err = open.CreateSession(ctx, anna.Policy{Network: anna.NetworkPolicy{Mode: anna.NetworkAllowAll}})
	must(t, err)
	must(t, s.Close())
}
