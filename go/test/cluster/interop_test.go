package cluster

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	agentbox "agentbox.dev/go"
)

// The Rust CLI (`agentbox lock`, the debug build beside the operator) and this client hold
// the same Lease for one scope: each excludes the other, and fencing tokens grow across them.
func TestTheGuardExcludesTheRustCLI(t *testing.T) {
	cli := os.Getenv("AGENTBOX_CLI_BIN")
	if cli == "" {
		cli = filepath.Join(filepath.Dir(operatorBin()), "agentbox")
	}
	if _, err := os.Stat(cli); err != nil {
		t.Fatalf("%s is missing: cargo build --bin agentbox (hack/test builds it)", cli)
	}
	ctx := context.Background()
	scope := agentbox.UserScope("go-interop", "u@example.com")
	lock := func(wait string, cmd ...string) *exec.Cmd {
		args := append([]string{"lock", "-n", ns, "--agent", scope.Agent, "--user", scope.User, "--wait", wait, "--"}, cmd...)
		return exec.Command(cli, args...)
	}
	// The CLI locks the scope of a Sandbox that exists (one without a pod will do).
	if _, err := sandboxes.GetOrCreate(ctx, scope, agentbox.SandboxSpec{Image: baseImage, ImagePullPolicy: "Never", Lifecycle: &agentbox.LifecycleSpec{Mode: "Suspended"}}); err != nil {
		t.Fatal(err)
	}
	g := sandboxes.Guard(scope, agentbox.GuardConfig{Wait: 5 * time.Second})
	must(t, g.Acquire(ctx))
	out, err := lock("2", "true").CombinedOutput()
	if err == nil || !strings.Contains(string(out), g.Holder()) {
		t.Fatalf("the CLI and a guard this client holds: %v: %s", err, out)
	}
	token := g.FencingToken()
	must(t, g.Release(ctx))
	out, err = lock("20", "sh", "-c", `echo "$AGENTBOX_FENCING_TOKEN"`).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			out = ee.Stderr
		}
		t.Fatalf("the CLI after the release: %v: %s", err, out)
	}
	cliToken, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	if err != nil || cliToken <= token {
		t.Fatalf("the CLI's token %q after this client's %d", out, token)
	}
	// The CLI holds it now: this client waits, and gives up at its wait.
	held := lock("20", "sleep", "6")
	must(t, held.Start())
	defer func() { _ = held.Process.Kill(); _ = held.Wait() }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		g2 := sandboxes.Guard(scope, agentbox.GuardConfig{Wait: 500 * time.Millisecond})
		err := g2.Acquire(ctx)
		if errors.Is(err, agentbox.ErrGuardTimeout) {
			break
		}
		if err == nil {
			_ = g2.Release(ctx)
		}
		if time.Now().After(deadline) {
			t.Fatalf("this client never saw the CLI's hold: %v", err)
		}
	}
	must(t, held.Wait())
	g3 := sandboxes.Guard(scope, agentbox.GuardConfig{Wait: 20 * time.Second})
	must(t, g3.Acquire(ctx))
	if g3.FencingToken() <= cliToken {
		t.Fatalf("token %d after the CLI's %d", g3.FencingToken(), cliToken)
	}
	must(t, g3.Release(ctx))
}
