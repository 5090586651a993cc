package anna

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
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

// networkVerdict is what obj (a Sandbox) means for a session whose egress relies on
// NetworkPolicy (relies: None or Allowlist) or not, and why when it is not enforced (pure).
func networkVerdict(relies bool, obj map[string]any) (netVerdict, string) {
	if !relies {
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
	what := "disabled"
	if p.NetworkModeOrDefault() != NetworkDisabled {
		what = "allowed through Agentbox.Allow (egress Allowlist)"
	}
	return f.incompatible(p, "Network.Mode", fmt.Sprintf(
		"%s needs NetworkPolicy enforced on the node of sandbox %s, and it is not known to be: %s", what, name, why))
}

// watchNetwork reads the sandbox (read) every `every` until ctx ends (nil) or the operator
// says its egress policy is not enforced (the refusal).
func (f *Agentbox) watchNetwork(ctx context.Context, p Policy, name string, read func(context.Context) (map[string]any, error), every time.Duration) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if obj, err := read(ctx); err == nil {
			if v, why := networkVerdict(f.reliesOnPolicy(p), obj); v == netRefused {
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
// disabled, or allowed through Agentbox.Allow) a refusal as soon as the operator finds it not enforced, or once the sandbox
// serves without NetworkEnforced True, or when the wait ends with the network the cause.
func (f *Agentbox) recoverEnforced(ctx context.Context, p Policy, sbx *agentbox.Sandbox, wait time.Duration) error {
	if !f.reliesOnPolicy(p) {
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
	v, why := networkVerdict(f.reliesOnPolicy(p), obj)
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

// domainPattern is the CRD's rule for a domain entry: a lower-case DNS name with at least one
// dot, optionally "*." first; a name ending in a number (an address) is refused apart.
var domainPattern = regexp.MustCompile(`^([*][.])?([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?[.])*[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// numericEnd matches a name whose last label is a number (an address, which goes in CIDR).
var numericEnd = regexp.MustCompile(`[.][0-9]+$`)

// objectName is the CRD's rule for a credential's Secret name: a Kubernetes object name (a
// DNS-1123 subdomain).
var objectName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// dataKey is the CRD's rule for a credential's key: a Secret data key.
var dataKey = regexp.MustCompile(`^[-._a-zA-Z0-9]+$`)

// headerName is the CRD's rule for a credential's header: an HTTP token.
var headerName = regexp.MustCompile("^[-!#$%&'*+.^_`|~0-9a-zA-Z]+$")

// proxyHeaders are the headers the egress proxy owns (a credential cannot be one of them, nor
// Proxy-*).
var proxyHeaders = []string{"host", "connection", "content-length", "transfer-encoding", "keep-alive", "upgrade", "te", "trailer"}

// checkCredential refuses, naming the cause in the CRD's words, a credential the CRD would
// refuse (pure): on a CIDR or a "*." wildcard (the key would go to every name below it), a
// SecretName that is no object name, a Key that is no Secret key, a Header the proxy may not
// set. Whether the Secret allows the domain is the operator's to check (CredentialRefused).
func checkCredential(a agentbox.EgressAllow) string {
	c := a.Credential
	lower := strings.ToLower(c.Header)
	switch {
	case a.Domain == "" || strings.HasPrefix(a.Domain, "*."):
		return "Credential: a credential goes with an exact domain (such as api.example.com), not a CIDR or a '*.' wildcard: a wildcard would send the key to every name below it"
	case len(c.SecretName) > 253 || !objectName.MatchString(c.SecretName):
		return fmt.Sprintf("Credential.SecretName must be a Kubernetes object name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit, not %q", c.SecretName)
	case len(c.Key) > 253 || c.Key == "." || c.Key == ".." || !dataKey.MatchString(c.Key):
		return fmt.Sprintf("Credential.Key must be a Secret key: letters, digits, '-', '_' and '.', not %q", c.Key)
	case c.Header != "" && (len(c.Header) > 64 || !headerName.MatchString(c.Header) || slices.Contains(proxyHeaders, lower) || strings.HasPrefix(lower, "proxy-")):
		return fmt.Sprintf("Credential.Header must be an HTTP header name that is not Host, Connection, Content-Length, Transfer-Encoding, Keep-Alive, Upgrade, TE, Trailer or Proxy-*, not %q (\"\": Authorization)", c.Header)
	}
	return ""
}

// checkAllow refuses, naming the entry and the cause, what the CRD's rules would refuse in an
// Agentbox.Allow (pure): an entry with neither or both of CIDR and Domain, a CIDR that is not
// an address block, a domain not in the CRD's form, a domain's port other than TCP, a port out
// of range, a credential that checkCredential refuses.
func checkAllow(allow []agentbox.EgressAllow) error {
	bad := func(i int, format string, a ...any) error {
		return fmt.Errorf("%w: Agentbox.Allow[%d]: %s", agentbox.ErrInvalid, i, fmt.Sprintf(format, a...))
	}
	if len(allow) > 64 {
		return fmt.Errorf("%w: Agentbox.Allow has %d entries; at most 64 are allowed", agentbox.ErrInvalid, len(allow))
	}
	for i, a := range allow {
		switch {
		case a.CIDR == "" && a.Domain == "":
			return bad(i, "needs CIDR (an address block such as 10.0.0.0/8) or Domain (a name such as pypi.org or *.github.com)")
		case a.CIDR != "" && a.Domain != "":
			return bad(i, "has either CIDR or Domain, not both: write two entries")
		case a.CIDR != "":
			if _, err := netip.ParsePrefix(a.CIDR); err != nil {
				return bad(i, "CIDR must be an address block in CIDR notation, such as 10.0.0.0/8, not %q", a.CIDR)
			}
		default:
			if len(a.Domain) > 253 || !domainPattern.MatchString(a.Domain) || !strings.Contains(a.Domain, ".") || numericEnd.MatchString(a.Domain) {
				return bad(i, "Domain must be a lower-case DNS name with at least one dot, optionally starting with '*.' (such as pypi.org or *.github.com), not %q; addresses go in CIDR", a.Domain)
			}
		}
		if a.Credential != nil {
			if why := checkCredential(a); why != "" {
				return bad(i, "%s", why)
			}
		}
		for j, p := range a.Ports {
			if p.Port < 1 || p.Port > 65535 || (p.EndPort != 0 && (p.EndPort < p.Port || p.EndPort > 65535)) {
				return bad(i, "Ports[%d]: port %d through %d is not a range within 1-65535", j, p.Port, p.EndPort)
			}
			if a.Domain != "" && p.Protocol != "" && p.Protocol != "TCP" {
				return bad(i, "Ports[%d]: the ports of a domain entry are TCP (the egress proxy carries HTTP and TLS over TCP only), not %s", j, p.Protocol)
			}
		}
	}
	return nil
}
