package anna

import (
	"context"
	"fmt"
	"time"

	agentbox "agentbox.dev/go"
)

// Fail closed on the network: a policy with NetworkDisabled is honoured only by a sandbox whose
// egress None the operator has proven enforced on its node (or the administrator attests it):
// its NetworkEnforced condition True. The operator holds such a sandbox not Ready otherwise,
// and CreateSession turns that into a PolicyCompatibilityError naming the cause: at once when
// the operator found NetworkPolicy not enforced, else when the ready wait ends.

// netVerdict is what a Sandbox object says of the enforcement its egress needs.
type netVerdict int

const (
	// netEnforced: enforced (proven or attested), or nothing to enforce.
	netEnforced netVerdict = iota
	// netPending: not known yet (the operator checks, or its check was inconclusive).
	netPending
	// netRefused: the operator found NetworkPolicy not enforced on the sandbox's node.
	netRefused
)

// The operator's NetworkEnforced condition and the reason of a node where NetworkPolicy is
// not enforced (docs/protocol.md).
const (
	condNetworkEnforced = "NetworkEnforced"
	reasonNotEnforced   = "NetworkPolicyNotEnforced"
)

// netPoll is how often CreateSession reads the sandbox for a NetworkEnforced verdict while it
// waits for the sandbox.
const netPoll = 500 * time.Millisecond

// condition returns the status, reason and message of obj's condition typ (found: false when
// it has none).
func condition(obj map[string]any, typ string) (status, reason, message string, found bool) {
	st, _ := obj["status"].(map[string]any)
	conds, _ := st["conditions"].([]any)
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if s, _ := m["type"].(string); s == typ {
			status, _ = m["status"].(string)
			reason, _ = m["reason"].(string)
			message, _ = m["message"].(string)
			return status, reason, message, true
		}
	}
	return "", "", "", false
}

// networkVerdict is what obj (a Sandbox) means for a session under mode, and why when it is
// not enforced (pure).
func networkVerdict(mode NetworkMode, obj map[string]any) (netVerdict, string) {
	if mode != NetworkDisabled {
		return netEnforced, ""
	}
	status, reason, message, found := condition(obj, condNetworkEnforced)
	switch {
	case !found:
		return netPending, "the operator has reported no NetworkEnforced condition for it (an operator that does not check NetworkPolicy enforcement, or it has not yet)"
	case status == "True":
		return netEnforced, ""
	case status == "False" && reason == reasonNotEnforced:
		return netRefused, fmt.Sprintf("NetworkEnforced is False (%s): %s", reason, message)
	}
	return netPending, fmt.Sprintf("NetworkEnforced is %s (%s): %s", status, reason, message)
}

// networkRefusal is the error of a session under p on sandbox name that cannot be given
// because its egress is not known to be enforced: why says what the operator reported.
func (f *Agentbox) networkRefusal(p Policy, name, why string) error {
	return f.incompatible(p, "Network.Mode", fmt.Sprintf(
		"disabled needs NetworkPolicy enforced on the node of sandbox %s, and it is not known to be: %s", name, why))
}

// watchNetwork reads the sandbox (read) every `every` until ctx ends (nil) or the operator
// says its egress policy is not enforced (the refusal).
func (f *Agentbox) watchNetwork(ctx context.Context, p Policy, name string, read func(context.Context) (map[string]any, error), every time.Duration) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if obj, err := read(ctx); err == nil {
			if v, why := networkVerdict(p.NetworkModeOrDefault(), obj); v == netRefused {
				return f.networkRefusal(p, name, why)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// recoverEnforced is sbx.Recover, and for a policy that relies on enforcement (its network
// disabled) a refusal as soon as the operator finds it not enforced, or once the sandbox
// serves without NetworkEnforced True, or when the wait ends with the network the cause.
func (f *Agentbox) recoverEnforced(ctx context.Context, p Policy, sbx *agentbox.Sandbox, wait time.Duration) error {
	mode := p.NetworkModeOrDefault()
	if mode != NetworkDisabled {
		return sbx.Recover(ctx, wait)
	}
	name := sbx.Name()
	read := func(ctx context.Context) (map[string]any, error) {
		b, err := f.Sandboxes.Open(ctx, name)
		if err != nil {
			return nil, err
		}
		return b.Obj, nil
	}
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		if err := f.watchNetwork(rctx, p, name, read, netPoll); err != nil {
			cancel(err)
		}
	}()
	err := sbx.Recover(rctx, wait)
	if cause := context.Cause(rctx); cause != nil && IsPolicyCompatibilityError(cause) {
		return cause
	}
	return f.afterRecover(p, sbx.Obj, err)
}

// afterRecover is the outcome of a session under p once the wait for its sandbox (obj as
// last read) ended with err (pure): a sandbox that serves but whose NetworkEnforced is not
// True is refused, and a wait that failed while the network was not known to be enforced is
// refused naming that cause.
func (f *Agentbox) afterRecover(p Policy, obj map[string]any, err error) error {
	v, why := networkVerdict(p.NetworkModeOrDefault(), obj)
	if v == netEnforced {
		return err
	}
	meta, _ := obj["metadata"].(map[string]any)
	name, _ := meta["name"].(string)
	if err != nil {
		why = fmt.Sprintf("%s (the sandbox did not become ready: %v)", why, err)
	}
	return f.networkRefusal(p, name, why)
}
