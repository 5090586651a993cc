package anna

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	agentbox "agentbox.dev/go"
)

// sandboxWith is a Sandbox object named s with the NetworkEnforced condition (status, reason,
// message), or none when status is "".
func sandboxWith(status, reason, message string) map[string]any {
	st := map[string]any{"phase": "Ready"}
	if status != "" {
		st["conditions"] = []any{
			map[string]any{"type": "Ready", "status": "True", "reason": "Ready"},
			map[string]any{"type": "NetworkEnforced", "status": status, "reason": reason, "message": message},
		}
	}
	return map[string]any{"metadata": map[string]any{"name": "s"}, "status": st}
}

var notEnforced = sandboxWith("False", "NetworkPolicyNotEnforced",
	"NetworkPolicy is not enforced on node n1: ... Install a network plugin that enforces NetworkPolicy")

// What a sandbox's NetworkEnforced condition means for a session, by network mode.
func TestNetworkVerdictFailsClosedUnlessEnforcementIsProvenOrAttested(t *testing.T) {
	for _, c := range []struct {
		mode NetworkMode
		obj  map[string]any
		want netVerdict
	}{
		{"", sandboxWith("", "", ""), netEnforced},
		{NetworkAllowAll, notEnforced, netEnforced},
		{NetworkDisabled, sandboxWith("True", "Proven", ""), netEnforced},
		{NetworkDisabled, sandboxWith("True", "Attested", ""), netEnforced},
		{NetworkDisabled, notEnforced, netRefused},
		{NetworkDisabled, sandboxWith("False", "NetworkCheckInconclusive", "could not finish"), netPending},
		{NetworkDisabled, sandboxWith("False", "NetworkCheckPending", "checking"), netPending},
		{NetworkDisabled, sandboxWith("", "", ""), netPending},
		{NetworkDisabled, map[string]any{}, netPending},
	} {
		if got, why := networkVerdict(c.mode, c.obj); got != c.want || (got != netEnforced) == (why == "") {
			t.Errorf("%q %v: %v %q, want %v", c.mode, c.obj["status"], got, why, c.want)
		}
	}
}

// A session with the network disabled is refused, naming the cause, on a sandbox that serves
// without NetworkEnforced True (an operator that does not check), and when the wait fails
// while enforcement is not known; with the network allowed the wait's outcome stands.
func TestAfterRecoverRefusesWhatIsNotProven(t *testing.T) {
	f := &Agentbox{}
	disabled := Policy{Network: NetworkPolicy{Mode: NetworkDisabled}}
	if err := f.afterRecover(disabled, sandboxWith("True", "Proven", ""), nil); err != nil {
		t.Fatal(err)
	}
	err := f.afterRecover(disabled, sandboxWith("", "", ""), nil)
	var pe *PolicyCompatibilityError
	if !errors.As(err, &pe) || !strings.HasPrefix(pe.Reason, "Policy.Network.Mode: disabled needs NetworkPolicy enforced") ||
		!strings.Contains(pe.Reason, "no NetworkEnforced condition") {
		t.Fatalf("served without a verdict: %v", err)
	}
	waited := &agentbox.SandboxError{Kind: agentbox.ErrSandboxNotReady, Name: "s", Reason: "NetworkCheckInconclusive", Message: "not Ready after 2m0s"}
	err = f.afterRecover(disabled, sandboxWith("False", "NetworkCheckInconclusive", "the check could not finish"), waited)
	if !errors.As(err, &pe) || !strings.Contains(pe.Reason, "NetworkCheckInconclusive") || !strings.Contains(pe.Reason, "did not become ready") {
		t.Fatalf("a wait that ended inconclusive: %v", err)
	}
	// Not the network's doing: the wait's own error.
	if err := f.afterRecover(Policy{}, sandboxWith("", "", ""), waited); !errors.Is(err, agentbox.ErrSandboxNotReady) {
		t.Fatalf("allow_all: %v", err)
	}
	if err := f.afterRecover(disabled, sandboxWith("True", "Attested", ""), waited); !errors.Is(err, agentbox.ErrSandboxNotReady) {
		t.Fatalf("attested: %v", err)
	}
}

// While the session waits for its sandbox, the operator's verdict "not enforced" ends the
// wait at once with a refusal that carries the operator's reason and what to install; a
// pending or proven sandbox keeps it waiting until the context ends.
func TestWatchNetworkRefusesAsSoonAsTheOperatorSaysNotEnforced(t *testing.T) {
	f := &Agentbox{}
	disabled := Policy{Network: NetworkPolicy{Mode: NetworkDisabled}}
	seq := []map[string]any{sandboxWith("", "", ""), sandboxWith("False", "NetworkCheckPending", "checking"), notEnforced}
	reads := 0
	read := func(context.Context) (map[string]any, error) {
		if reads == 1 {
			reads++
			return nil, errors.New("a failed read is retried")
		}
		obj := seq[min(reads, len(seq)-1)]
		reads++
		return obj, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := f.watchNetwork(ctx, disabled, "s", read, time.Millisecond)
	var pe *PolicyCompatibilityError
	if !errors.As(err, &pe) || !strings.Contains(pe.Reason, "NetworkPolicyNotEnforced") ||
		!strings.Contains(pe.Reason, "Install a network plugin") || !strings.Contains(pe.Reason, "sandbox s") {
		t.Fatalf("got %v after %d reads", err, reads)
	}
	if ctx.Err() != nil {
		t.Fatal("the refusal came only when the context ended")
	}
	proven := func(context.Context) (map[string]any, error) { return sandboxWith("True", "Proven", ""), nil }
	short, stop := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer stop()
	if err := f.watchNetwork(short, disabled, "s", proven, time.Millisecond); err != nil {
		t.Fatalf("proven: %v", err)
	}
	if short.Err() == nil {
		t.Fatal("watchNetwork returned before its context ended")
	}
}
