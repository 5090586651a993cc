package cluster

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	agentbox "agentbox.dev/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

func spec() agentbox.SandboxSpec {
	return agentbox.SandboxSpec{Image: baseImage, ImagePullPolicy: "Never"}
}

// readySandbox is a Ready sandbox of a Session scope of the test's own.
func readySandbox(t *testing.T, id string) *agentbox.Sandbox {
	t.Helper()
	ctx := context.Background()
	sbx, err := sandboxes.GetOrCreate(ctx, agentbox.SessionScope("go-tests", ns+"-"+id), spec())
	if err != nil {
		t.Fatal(err)
	}
	if err := sbx.WaitReady(ctx, 2*time.Minute); err != nil {
		t.Fatalf("%v\n%s", err, tail(opLog, 40))
	}
	return sbx
}

func TestGetOrCreateIsTheScopesSandboxWithItsLabels(t *testing.T) {
	ctx := context.Background()
	scope := agentbox.UserScope("go-tests", "alice@example.com")
	a, err := sandboxes.GetOrCreate(ctx, scope, spec())
	if err != nil {
		t.Fatal(err)
	}
	b, err := sandboxes.GetOrCreate(ctx, scope, spec())
	if err != nil {
		t.Fatal(err)
	}
	if a.Name() != agentbox.SandboxNameForScope(scope) || b.Name() != a.Name() {
		t.Fatalf("names %s %s", a.Name(), b.Name())
	}
	u, err := dyn.Resource(sbxGVR).Namespace(ns).Get(ctx, a.Name(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range agentbox.ScopeLabels(scope) {
		if u.GetLabels()[k] != v {
			t.Errorf("label %s=%q, want %q", k, u.GetLabels()[k], v)
		}
	}
	if u.GetAnnotations()[agentbox.AnnotUserID] != "alice@example.com" {
		t.Errorf("annotations %v", u.GetAnnotations())
	}
	// The name of the scope holding another scope's Sandbox is refused, not shared.
	other := agentbox.UserScope("go-tests", "bob")
	obj := map[string]any{
		"apiVersion": agentbox.Group + "/" + agentbox.Version, "kind": "Sandbox",
		"metadata": map[string]any{"name": agentbox.SandboxNameForScope(other)},
		"spec": map[string]any{"image": baseImage, "imagePullPolicy": "Never", "lifecycle": map[string]any{"mode": "Suspended"},
			"scope": map[string]any{"kind": "User", "agent": "go-tests", "user": "alice@example.com"}},
	}
	if _, err := dyn.Resource(sbxGVR).Namespace(ns).Create(ctx, unstructuredOf(obj), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := sandboxes.GetOrCreate(ctx, other, spec()); !errors.Is(err, agentbox.ErrScopeMismatch) {
		t.Fatalf("got %v", err)
	}
	if _, err := sandboxes.GetOrCreate(ctx, agentbox.Scope{Kind: agentbox.ScopeSession, Agent: "x"}, spec()); !errors.Is(err, agentbox.ErrInvalid) {
		t.Fatalf("a scope without its session id: %v", err)
	}
	for _, s := range []*agentbox.Sandbox{a} {
		if err := s.Delete(ctx, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := sandboxes.Open(ctx, a.Name()); !errors.Is(err, agentbox.ErrNotFound) {
		t.Fatalf("after delete with wait: %v", err)
	}
}

func TestExec(t *testing.T) {
	ctx := context.Background()
	sbx := readySandbox(t, "exec")
	r, err := sbx.Run(ctx, "echo out; echo err >&2; exit 3", agentbox.ExecOptions{})
	if err != nil || r.ExitCode != 3 || string(r.Stdout) != "out\n" || string(r.Stderr) != "err\n" {
		t.Fatalf("%+v %v", r, err)
	}
	r, err = sbx.Exec(ctx, []string{"no-such-program"}, agentbox.ExecOptions{})
	if err != nil || r.ExitCode != 127 {
		t.Fatalf("not found: %+v %v", r, err)
	}
	// stdin: exact bytes (binary), and a stream of unknown length.
	bin := bytes.Repeat([]byte{0, 1, 2, 255, '\n'}, 100000)
	r, err = sbx.Exec(ctx, []string{"sh", "-c", "cat | wc -c"}, agentbox.ExecOptions{Stdin: bytes.NewReader(bin)})
	if err != nil || strings.TrimSpace(string(r.Stdout)) != "500000" {
		t.Fatalf("stdin: %+v %v", r, err)
	}
	r, err = sbx.Exec(ctx, []string{"cat"}, agentbox.ExecOptions{Stdin: io.MultiReader(bytes.NewReader(bin))})
	if err != nil || !bytes.Equal(r.Stdout, bin) {
		t.Fatalf("streamed stdin: %d bytes, %v", len(r.Stdout), err)
	}
	// env and working directory, and the workspace root by default.
	r, err = sbx.Run(ctx, `printf '%s|%s|' "$A" "$B"; pwd`, agentbox.ExecOptions{Env: map[string]string{"A": "x y", "B": "it's \"q\""}})
	if err != nil || string(r.Stdout) != "x y|it's \"q\"|/workspace\n" {
		t.Fatalf("env: %q %v", r.Stdout, err)
	}
	r, err = sbx.Run(ctx, "pwd", agentbox.ExecOptions{Workdir: "/tmp"})
	if err != nil || string(r.Stdout) != "/tmp\n" {
		t.Fatalf("workdir: %q %v", r.Stdout, err)
	}
	if r, err := sbx.Run(ctx, "true", agentbox.ExecOptions{Workdir: "/nonexistent"}); err != nil || r.ExitCode != 126 {
		t.Fatalf("a missing workdir: %+v %v", r, err)
	}
	// Large output arrives whole: the trailer proves it.
	r, err = sbx.Run(ctx, "head -c 3000000 /dev/zero", agentbox.ExecOptions{})
	if err != nil || len(r.Stdout) != 3000000 || r.StdoutTruncated {
		t.Fatalf("large output: %d %v", len(r.Stdout), err)
	}
	r, err = sbx.Run(ctx, "head -c 3000 /dev/zero", agentbox.ExecOptions{MaxOutput: 1000})
	if err != nil || len(r.Stdout) != 1000 || !r.StdoutTruncated {
		t.Fatalf("capped: %d %v", len(r.Stdout), err)
	}
	// Output that ends like the start of a mark is passed on whole.
	r, err = sbx.Run(ctx, "printf 'x__AGENTBOX_'", agentbox.ExecOptions{})
	if err != nil || string(r.Stdout) != "x__AGENTBOX_" {
		t.Fatalf("mark-like output: %q %v", r.Stdout, err)
	}
	// Check turns a non-zero exit into a CommandError.
	_, err = sbx.Run(ctx, "echo nope >&2; exit 5", agentbox.ExecOptions{Check: true})
	var ce *agentbox.CommandError
	if !errors.As(err, &ce) || ce.Result.ExitCode != 5 || !errors.Is(err, agentbox.ErrCommand) {
		t.Fatalf("check: %v", err)
	}
}

func TestExecTimeoutKillsTheProcessGroup(t *testing.T) {
	ctx := context.Background()
	sbx := readySandbox(t, "timeout")
	_, err := sbx.Run(ctx, "echo started; (sleep 30; echo child >> /workspace/late) & sleep 30", agentbox.ExecOptions{Timeout: time.Second})
	var te *agentbox.ExecTimeoutError
	if !errors.As(err, &te) || !errors.Is(err, agentbox.ErrExecTimeout) || te.Result == nil {
		t.Fatalf("got %v", err)
	}
	if !te.Result.TimedOut || te.Result.ExitCode != 137 || string(te.Result.Stdout) != "started\n" {
		t.Fatalf("result %+v", te.Result)
	}
	// No process of the group is left: the background sleep was killed too.
	r, err := sbx.Run(ctx, "ps -o args | grep -c '[s]leep 30'", agentbox.ExecOptions{})
	if err != nil || strings.TrimSpace(string(r.Stdout)) != "0" {
		t.Fatalf("left: %q %v", r.Stdout, err)
	}
}

// Kill ends the started process and its children in the pod, whatever their process group,
// and Wait then has SIGKILL's status.
func TestProcessKillEndsItInThePod(t *testing.T) {
	ctx := context.Background()
	sbx := readySandbox(t, "kill")
	p, err := sbx.Start(ctx, []string{"sh", "-c", "sleep 1004 & setsid sleep 1014 & echo up; sleep 1024"}, agentbox.ExecOptions{})
	if err != nil {
		t.Fatal(err)
	}
	up := make([]byte, 3)
	if _, err := io.ReadFull(p.Stdout, up); err != nil || string(up) != "up\n" {
		t.Fatalf("%q %v", up, err)
	}
	// The command's pid: its sh, which execs its last command (busybox's ash does).
	pid, err := p.PID(ctx)
	if err != nil || pid <= 1 {
		t.Fatalf("pid %d %v", pid, err)
	}
	if r, err := sbx.Run(ctx, "tr '\\0' ' ' </proc/$P/cmdline", agentbox.ExecOptions{Env: map[string]string{"P": strconv.Itoa(pid)}}); err != nil || string(r.Stdout) != "sleep 1024 " {
		t.Fatalf("pid %d is %q %v", pid, r.Stdout, err)
	}
	must(t, p.Kill())
	st, err := p.Wait()
	if err != nil || !st.HasCode || st.Code != 137 {
		t.Fatalf("after Kill: %+v %v", st, err)
	}
	r, err := sbx.Run(ctx, "ps -o args | grep '[s]leep 10'", agentbox.ExecOptions{})
	if err != nil || len(r.Stdout) != 0 {
		t.Fatalf("left running in the pod after Kill: %q %v", r.Stdout, err)
	}
	if _, err := p.Stdout.Read(up); !errors.Is(err, agentbox.ErrProcessKilled) {
		t.Fatalf("read after Kill: %v", err)
	}
}

// An output over the cap is flagged, an error when asked (FailTruncated), and the cap can
// be raised: one-shot and in a session.
func TestOutputOverTheCap(t *testing.T) {
	ctx := context.Background()
	sbx := readySandbox(t, "cap")
	sh := sbx.Session("")
	defer sh.Close()
	for name, run := range map[string]func(agentbox.ExecOptions) (*agentbox.ExecResult, error){
		"exec": func(o agentbox.ExecOptions) (*agentbox.ExecResult, error) {
			return sbx.Run(ctx, "head -c 9437184 /dev/zero", o)
		},
		"session": func(o agentbox.ExecOptions) (*agentbox.ExecResult, error) {
			return sh.Run(ctx, "head -c 9437184 /dev/zero", o)
		},
	} {
		r, err := run(agentbox.ExecOptions{})
		if err != nil || len(r.Stdout) != 8<<20 || !r.StdoutTruncated || r.StderrTruncated {
			t.Fatalf("%s: 9 MiB under the default cap: %d bytes, %v", name, len(r.Stdout), err)
		}
		r, err = run(agentbox.ExecOptions{FailTruncated: true})
		var te *agentbox.OutputTruncatedError
		if !errors.Is(err, agentbox.ErrOutputTruncated) || !errors.As(err, &te) || te.Limit != 8<<20 || len(r.Stdout) != 8<<20 || r.ExitCode != 0 {
			t.Fatalf("%s: FailTruncated: %v", name, err)
		}
		r, err = run(agentbox.ExecOptions{MaxOutput: 16 << 20, FailTruncated: true})
		if err != nil || len(r.Stdout) != 9<<20 || r.StdoutTruncated {
			t.Fatalf("%s: a raised cap: %d bytes, %v", name, len(r.Stdout), err)
		}
	}
}

func TestSession(t *testing.T) {
	ctx := context.Background()
	sbx := readySandbox(t, "session")
	s := sbx.Session("")
	defer s.Close()
	for i := 0; i < 5; i++ {
		r, err := s.Run(ctx, "echo $((40+2)); echo e >&2; exit 7", agentbox.ExecOptions{})
		if err != nil || r.ExitCode != 7 || string(r.Stdout) != "42\n" || string(r.Stderr) != "e\n" {
			t.Fatalf("%d: %+v %v", i, r, err)
		}
	}
	// The shell runs in the workspace root: a command without a Workdir of its own is there.
	if r, err := s.Run(ctx, "pwd", agentbox.ExecOptions{}); err != nil || string(r.Stdout) != sbx.WorkspaceRoot()+"\n" {
		t.Fatalf("pwd: %+v %v", r, err)
	}
	r, err := s.Run(ctx, `echo "$A"; pwd`, agentbox.ExecOptions{Env: map[string]string{"A": "a b"}, Workdir: "/tmp"})
	if err != nil || string(r.Stdout) != "a b\n/tmp\n" {
		t.Fatalf("env/workdir: %q %v", r.Stdout, err)
	}
	_, err = s.Run(ctx, "sleep 30", agentbox.ExecOptions{Timeout: 500 * time.Millisecond})
	var te *agentbox.ExecTimeoutError
	if !errors.As(err, &te) || te.Result == nil || te.Result.ExitCode != 137 {
		t.Fatalf("timeout: %v", err)
	}
	// The shell goes on after a timeout.
	if r, err := s.Run(ctx, "echo after", agentbox.ExecOptions{}); err != nil || string(r.Stdout) != "after\n" {
		t.Fatalf("after the timeout: %+v %v", r, err)
	}
	// A shell that dies between commands is replaced.
	if _, err := s.Run(ctx, "kill -9 $PPID", agentbox.ExecOptions{}); err == nil {
		t.Log("the shell's kill reported no error")
	}
	if r, err := s.Run(ctx, "echo new", agentbox.ExecOptions{}); err != nil || string(r.Stdout) != "new\n" {
		t.Fatalf("new shell: %+v %v", r, err)
	}
	// A session in a directory that does not exist fails its command, saying which.
	bad := sbx.Session("/no/such/dir")
	defer bad.Close()
	_, err = bad.Run(ctx, "true", agentbox.ExecOptions{})
	if !errors.Is(err, agentbox.ErrSession) || !strings.Contains(err.Error(), "/no/such/dir") {
		t.Fatalf("a missing session directory: %v", err)
	}
}

func TestFiles(t *testing.T) {
	ctx := context.Background()
	sbx := readySandbox(t, "files")
	data := bytes.Repeat([]byte("héllo\x00\n"), 5000)
	if err := sbx.WriteFile(ctx, "a/b/c.bin", data, 0); err != nil {
		t.Fatal(err)
	}
	got, err := sbx.ReadFile(ctx, "/workspace/a/b/c.bin")
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes, %v", len(got), err)
	}
	if err := sbx.WriteFile(ctx, "run.sh", []byte("#!/bin/sh\necho ran\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	st, err := sbx.Stat(ctx, "run.sh")
	if err != nil || st.Kind != agentbox.KindFile || st.Mode != 0o755 || st.Size != 19 {
		t.Fatalf("stat %+v %v", st, err)
	}
	if r, err := sbx.Run(ctx, "./run.sh", agentbox.ExecOptions{}); err != nil || string(r.Stdout) != "ran\n" {
		t.Fatalf("run %+v %v", r, err)
	}
	if _, err := sbx.Run(ctx, "ln -s /etc evil && ln -s a/b inner", agentbox.ExecOptions{Check: true}); err != nil {
		t.Fatal(err)
	}
	entries, err := sbx.ReadDir(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if e.Name == ".agentbox" {
			continue // the operator's
		}
		names = append(names, e.Name+":"+string(e.Kind))
	}
	if strings.Join(names, ",") != "a:Dir,evil:Symlink,inner:Symlink,run.sh:File" {
		t.Fatalf("listing %v", names)
	}
	// A symlink out of the workspace is refused in the pod; one inside is followed.
	if _, err := sbx.ReadFile(ctx, "evil/passwd"); !errors.Is(err, agentbox.ErrPath) {
		t.Fatalf("escape: %v", err)
	}
	if got, err := sbx.ReadFile(ctx, "inner/c.bin"); err != nil || len(got) != len(data) {
		t.Fatalf("inner link: %v", err)
	}
	if _, err := sbx.ReadFile(ctx, "missing"); !errors.Is(err, agentbox.ErrFileNotFound) {
		t.Fatalf("missing: %v", err)
	}
	if err := sbx.Remove(ctx, "a", false); !errors.Is(err, agentbox.ErrRemote) {
		t.Fatalf("rmdir of a full directory: %v", err)
	}
	if err := sbx.Remove(ctx, "a", true); err != nil {
		t.Fatal(err)
	}
	if err := sbx.Remove(ctx, "", true); err == nil {
		t.Fatal("the workspace root was removed")
	}
	// Directories both ways.
	src := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(src, "d", "e"), 0o755))
	must(t, os.WriteFile(filepath.Join(src, "d", "e", "f.txt"), []byte("deep"), 0o644))
	must(t, os.WriteFile(filepath.Join(src, "top"), bytes.Repeat([]byte{7}, 300000), 0o600))
	must(t, os.Symlink("d/e/f.txt", filepath.Join(src, "ln")))
	if err := sbx.UploadDir(ctx, src, "up"); err != nil {
		t.Fatal(err)
	}
	if got, err := sbx.ReadFile(ctx, "up/d/e/f.txt"); err != nil || string(got) != "deep" {
		t.Fatalf("uploaded: %q %v", got, err)
	}
	// Through a spool in the state directory, removed once extracted.
	if r, err := sbx.Exec(ctx, []string{"ls", "-A", sbx.WorkspaceRoot() + "/.agentbox/tmp"}, agentbox.ExecOptions{}); err != nil || r.ExitCode != 0 || len(r.Stdout) != 0 {
		t.Fatalf("spools left: %+v %v", r, err)
	}
	dst := t.TempDir()
	if err := sbx.DownloadDir(ctx, "up", dst); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(dst, "ln")); err != nil || string(got) != "deep" {
		t.Fatalf("downloaded link: %q %v", got, err)
	}
	if got, err := os.ReadFile(filepath.Join(dst, "top")); err != nil || len(got) != 300000 {
		t.Fatalf("downloaded: %d %v", len(got), err)
	}
	if err := sbx.DownloadDir(ctx, "no-such-dir", t.TempDir()); !errors.Is(err, agentbox.ErrFileNotFound) {
		t.Fatalf("download of a missing dir: %v", err)
	}
}

// A path with ".." is refused before any request: on a handle whose pod does not exist, a
// request would fail otherwise.
func TestDotDotIsRefusedBeforeAnyRequest(t *testing.T) {
	ctx := context.Background()
	scope := agentbox.SessionScope("go-tests", ns+"-never")
	sbx, err := sandboxes.GetOrCreate(ctx, scope, agentbox.SandboxSpec{Image: baseImage, ImagePullPolicy: "Never", Lifecycle: &agentbox.LifecycleSpec{Mode: "Suspended"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := sbx.Suspend(ctx); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"../etc/passwd", "a/../../x", "/etc/passwd"} {
		var pe *agentbox.PathError
		if _, err := sbx.ReadFile(ctx, p); !errors.As(err, &pe) || pe.Reason == "Escapes" {
			t.Errorf("%s: %v", p, err)
		}
		if err := sbx.WriteFile(ctx, p, []byte("x"), 0); !errors.Is(err, agentbox.ErrPath) {
			t.Errorf("%s: %v", p, err)
		}
	}
	if err := sbx.WaitReady(ctx, time.Minute); !errors.Is(err, agentbox.ErrSandboxSuspended) {
		t.Fatalf("a suspended sandbox's wait: %v", err)
	}
}

func TestSuspendResumeKeepsTheWorkspace(t *testing.T) {
	ctx := context.Background()
	sbx := readySandbox(t, "lifecycle")
	must(t, sbx.WriteFile(ctx, "kept", []byte("yes"), 0))
	must(t, sbx.Suspend(ctx))
	if err := sbx.WaitReady(ctx, time.Minute); !errors.Is(err, agentbox.ErrSandboxSuspended) {
		t.Fatalf("wait of a suspended sandbox: %v", err)
	}
	must(t, sbx.Resume(ctx))
	if err := sbx.WaitReady(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if got, err := sbx.ReadFile(ctx, "kept"); err != nil || string(got) != "yes" {
		t.Fatalf("after resume: %q %v", got, err)
	}
}

func TestAnImageThatDoesNotExistEndsTheWaitWithItsReason(t *testing.T) {
	ctx := context.Background()
	sbx, err := sandboxes.GetOrCreate(ctx, agentbox.SessionScope("go-tests", ns+"-noimage"), agentbox.SandboxSpec{Image: "docker.io/library/no-such-image:0", ImagePullPolicy: "Never"})
	if err != nil {
		t.Fatal(err)
	}
	// Generous: the wait ends as soon as the kubelet reports the image; a loaded CI machine
	// once took over 30 s to get that far (the pod still PodStarting).
	err = sbx.WaitReady(ctx, 3*time.Minute)
	var se *agentbox.SandboxError
	if !errors.As(err, &se) || !strings.Contains(se.Reason+se.Message, "Image") {
		t.Fatalf("got %v", err)
	}
}

func TestGuardExcludesAndFences(t *testing.T) {
	ctx := context.Background()
	scope := agentbox.SessionScope("go-tests", ns+"-guard")
	cfg := agentbox.GuardConfig{LeaseDuration: 3 * time.Second, Wait: time.Second}
	a := sandboxes.Guard(scope, cfg)
	must(t, a.Acquire(ctx))
	b := sandboxes.Guard(scope, cfg)
	var ge *agentbox.GuardError
	if err := b.Acquire(ctx); !errors.As(err, &ge) || !errors.Is(err, agentbox.ErrGuardTimeout) || ge.Holder != a.Holder() {
		t.Fatalf("second holder: %v", err)
	}
	// Held across several renewals.
	time.Sleep(4 * time.Second)
	if !a.Held() {
		t.Fatalf("lost: %v", a.Err())
	}
	first := a.FencingToken()
	must(t, a.Release(ctx))
	c := sandboxes.Guard(scope, cfg)
	must(t, c.Acquire(ctx))
	if c.FencingToken() <= first {
		t.Fatalf("tokens %d then %d", first, c.FencingToken())
	}
	// Another writer takes the lease: the holder sees it lost and its context ends.
	must(t, takeLease(ctx, c.LeaseName(), "someone-else"))
	select {
	case <-c.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the guard did not see the take-over")
	}
	if !errors.Is(c.Err(), agentbox.ErrGuardLost) || !errors.Is(c.Release(ctx), agentbox.ErrGuardLost) {
		t.Fatalf("lost: %v", c.Err())
	}
	// An expired holder is taken over (renewTime long past), with the token bumped.
	d := sandboxes.Guard(scope, agentbox.GuardConfig{LeaseDuration: 3 * time.Second, Wait: 20 * time.Second})
	lease, err := dyn.Resource(lseGVR).Namespace(ns).Get(ctx, c.LeaseName(), metav1.GetOptions{})
	must(t, err)
	before := lease.Object["spec"].(map[string]any)["leaseTransitions"].(int64)
	lease.Object["spec"].(map[string]any)["renewTime"] = agentbox.MicroTime(time.Now().Add(-time.Hour))
	_, err = dyn.Resource(lseGVR).Namespace(ns).Update(ctx, lease, metav1.UpdateOptions{})
	must(t, err)
	must(t, d.Acquire(ctx))
	if d.FencingToken() != before+1 {
		t.Fatalf("token %d after %d", d.FencingToken(), before)
	}
	must(t, d.Release(ctx))
}

func TestSnapshotAndRestore(t *testing.T) {
	ctx := context.Background()
	sbx := readySandbox(t, "snap")
	must(t, sbx.WriteFile(ctx, "state.txt", []byte("v1"), 0))
	snap, err := sbx.Snapshot(ctx, "", 3*time.Minute)
	if err != nil {
		t.Fatalf("%v\n%s", err, tail(opLog, 30))
	}
	if snap.Phase != "Ready" || snap.ScopeKey != agentbox.ScopeKey(sbx.Scope()) {
		t.Fatalf("%+v", snap)
	}
	lineage, err := sandboxes.Snapshots(ctx, sbx.Scope())
	if err != nil || len(lineage) != 1 || lineage[0].Name != snap.Name {
		t.Fatalf("lineage %v %v", lineage, err)
	}
	must(t, sbx.WriteFile(ctx, "state.txt", []byte("v2"), 0))
	must(t, sbx.Restore(ctx, snap.Name, 2*time.Minute))
	if err := sbx.WaitReady(ctx, 3*time.Minute); err != nil {
		t.Fatalf("%v\n%s", err, tail(opLog, 30))
	}
	if got, err := sbx.ReadFile(ctx, "state.txt"); err != nil || string(got) != "v1" {
		t.Fatalf("restored: %q %v", got, err)
	}
}

// takeLease writes another holder into the lease, as a second runner would: a conditioned
// write, read again when the holder's own renewal came between the read and the write (CI saw
// that 409 under load).
func takeLease(ctx context.Context, name, holder string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		lease, err := dyn.Resource(lseGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		lease.Object["spec"].(map[string]any)["holderIdentity"] = holder
		_, err = dyn.Resource(lseGVR).Namespace(ns).Update(ctx, lease, metav1.UpdateOptions{})
		return err
	})
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// A directory upload that would pass the workspace's size limit is ErrUploadTooLarge before
// anything is extracted, naming the limit (the limit is measured on this default node root; the
// check is the upload's own either way: tests/quota.rs has the hard limit), and leaves no spool;
// an upload that fits goes through afterwards.
func TestAnUploadThatWouldPassTheSizeLimitFailsWhole(t *testing.T) {
	ctx := context.Background()
	s := spec()
	s.Extra = map[string]any{"workspace": map[string]any{"sizeLimit": "64Mi"}}
	sbx, err := sandboxes.GetOrCreate(ctx, agentbox.SessionScope("go-tests", ns+"-limit"), s)
	if err != nil {
		t.Fatal(err)
	}
	if err := sbx.WaitReady(ctx, 3*time.Minute); err != nil {
		t.Fatalf("%v\n%s", err, tail(opLog, 40))
	}
	tree := func(mib int) string {
		d := t.TempDir()
		must(t, os.MkdirAll(filepath.Join(d, "sub"), 0o755))
		must(t, os.WriteFile(filepath.Join(d, "first.txt"), []byte("first"), 0o644))
		must(t, os.WriteFile(filepath.Join(d, "sub", "blob"), bytes.Repeat([]byte{7}, mib<<20), 0o644))
		return d
	}
	left := func() string {
		r, err := sbx.Run(ctx, "echo $(ls -A dst)/$(ls -A .agentbox/tmp | grep upload-)", agentbox.ExecOptions{})
		if err != nil || r.ExitCode != 0 {
			t.Fatalf("%+v %v", r, err)
		}
		return strings.TrimSpace(string(r.Stdout))
	}
	// ~40 MiB: its spool fits the 64 MiB, the spool and its files do not.
	err = sbx.UploadDir(ctx, tree(40), "dst")
	var re *agentbox.RemoteError
	if !errors.Is(err, agentbox.ErrUploadTooLarge) || !errors.As(err, &re) || !strings.Contains(re.Stderr, "size limit of 67108864 bytes") {
		t.Fatalf("got %v", err)
	}
	if got := left(); got != "/" {
		t.Fatalf("left: %q", got)
	}
	if err := sbx.UploadDir(ctx, tree(8), "dst"); err != nil {
		t.Fatal(err)
	}
	r, err := sbx.Run(ctx, "wc -c < dst/sub/blob", agentbox.ExecOptions{})
	if err != nil || strings.TrimSpace(string(r.Stdout)) != strconv.Itoa(8<<20) {
		t.Fatalf("the upload that fits: %+v %v", r, err)
	}
	if got := left(); got != "first.txt sub/" {
		t.Fatalf("left: %q", got)
	}
}
