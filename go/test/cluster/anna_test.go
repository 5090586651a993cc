package cluster

import (
	"bufio"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"strings"
	"testing"
	"time"

	agentbox "agentbox.dev/go"
	"agentbox.dev/go/anna"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	policy := anna.Policy{WorkingDir: "proj", Network: anna.NetworkNone, Env: map[string]string{"RUN": "r1"}, Timeout: time.Minute}
	s, err := factoryIface.CreateSession(ctx, policy)
	if err != nil {
		t.Fatalf("%v\n%s", err, tail(opLog, 40))
	}
	defer s.Close()
	if s.WorkingDir() != "/workspace/proj" || !s.Alive() || s.Policy().Env["RUN"] != "r1" {
		t.Fatalf("session %s %v", s.WorkingDir(), s.Alive())
	}
	r, err := s.Exec(ctx, `echo "$RUN $X"; pwd; exit 4`, anna.ExecOptions{Env: map[string]string{"X": "x"}})
	if err != nil || r.ExitCode != 4 || string(r.Stdout) != "r1 x\n/workspace/proj\n" {
		t.Fatalf("exec %+v %v", r, err)
	}
	r, err = s.Exec(ctx, "sleep 30", anna.ExecOptions{Timeout: 500 * time.Millisecond})
	if err != nil || !r.TimedOut || r.ExitCode != 137 {
		t.Fatalf("timeout %+v %v", r, err)
	}
	r, err = s.Exec(ctx, "tr a-z A-Z", anna.ExecOptions{Stdin: strings.NewReader("stdin\n")})
	if err != nil || string(r.Stdout) != "STDIN\n" {
		t.Fatalf("stdin %+v %v", r, err)
	}

	// A long-lived line-echo process over StartProcess (how stdio MCP servers run).
	p, err := s.StartProcess(ctx, anna.ProcessRequest{Command: []string{"sh", "-c", `while read -r l; do echo "echo:$l"; done; echo bye >&2`}})
	if err != nil {
		t.Fatal(err)
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
	if code, err := p.Wait(); err != nil || code != 0 {
		t.Fatalf("process end %d %v", code, err)
	}
	if e := <-errOut; e != "bye\n" {
		t.Fatalf("stderr %q", e)
	}

	// Files both ways: through Files() and through the host path of ResolvePath.
	files := anna.FilesOf(s)
	must(t, files.WriteFile("notes/a.txt", []byte("from the runner"), 0o640))
	if r, err := s.Exec(ctx, "cat notes/a.txt", anna.ExecOptions{}); err != nil || string(r.Stdout) != "from the runner" {
		t.Fatalf("written file in the pod: %+v %v", r, err)
	}
	if _, err := s.Exec(ctx, "mkdir -p out && echo made > out/b.txt", anna.ExecOptions{}); err != nil {
		t.Fatal(err)
	}
	if b, err := files.ReadFile("out/b.txt"); err != nil || string(b) != "made\n" {
		t.Fatalf("read %q %v", b, err)
	}
	info, err := files.Stat("notes/a.txt")
	if err != nil || info.Size() != 15 || info.Mode().Perm() != 0o640 || info.IsDir() {
		t.Fatalf("stat %v %v", info, err)
	}
	entries, err := files.ReadDir(".")
	if err != nil || len(entries) != 2 || entries[0].Name() != "notes" || !entries[0].IsDir() {
		t.Fatalf("readdir %v %v", entries, err)
	}
	if _, err := files.ReadFile("missing"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing: %v", err)
	}
	if _, err := files.ReadFile("../../etc/passwd"); !errors.Is(err, agentbox.ErrPath) {
		t.Fatalf("dotdot: %v", err)
	}
	host, err := s.ResolvePath("out/b.txt")
	if err != nil {
		t.Fatalf("ResolvePath on the node: %v", err)
	}
	if b, err := os.ReadFile(host); err != nil || string(b) != "made\n" {
		t.Fatalf("host read %s: %q %v", host, b, err)
	}
	hostNew, err := s.ResolvePath("/workspace/proj/from-host.txt")
	must(t, err)
	must(t, os.WriteFile(hostNew, []byte("host"), 0o644))
	if r, err := s.Exec(ctx, "cat from-host.txt", anna.ExecOptions{}); err != nil || string(r.Stdout) != "host" {
		t.Fatalf("host-written file: %+v %v", r, err)
	}
	if _, err := s.ResolvePath("../../x"); !errors.Is(err, agentbox.ErrPath) {
		t.Fatalf("ResolvePath dotdot: %v", err)
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
	if err != nil || string(r.Stdout) != "from the runnermade\n" {
		t.Fatalf("resumed workspace: %+v %v", r, err)
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
	_, err := f.CreateSession(ctx, anna.Policy{Network: anna.NetworkAllowlist, AllowedHosts: []string{"example.com"}})
	var pe *anna.PolicyCompatibilityError
	if !errors.As(err, &pe) || pe.Field != "Network" {
		t.Fatalf("got %v", err)
	}
	if _, err := sandboxes.OpenScope(ctx, f.Scope); !errors.Is(err, agentbox.ErrNotFound) {
		t.Fatalf("a sandbox was made: %v", err)
	}
	// The scope's existing sandbox under another network policy is not silently reused.
	g := factory("refused2", 2*time.Second)
	s, err := g.CreateSession(ctx, anna.Policy{Network: anna.NetworkNone})
	if err != nil {
		t.Fatal(err)
	}
	must(t, s.Close())
	if _, err := g.CreateSession(ctx, anna.Policy{Network: anna.NetworkFull}); !errors.As(err, &pe) || pe.Field != "Network" {
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
	lease, err := dyn.Resource(lseGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	must(t, err)
	lease.Object["spec"].(map[string]any)["holderIdentity"] = "another-runner"
	_, err = dyn.Resource(lseGVR).Namespace(ns).Update(ctx, lease, metav1.UpdateOptions{})
	must(t, err)
	select {
	case <-s.Done():
	case <-time.After(15 * time.Second):
		t.Fatal("Done did not close after the guard was taken over")
	}
	if _, err := s.Exec(ctx, "true", anna.ExecOptions{}); !errors.Is(err, anna.ErrClosed) {
		t.Fatalf("exec after the guard was lost: %v", err)
	}
}
