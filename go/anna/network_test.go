package anna

import (
	"context"
	"encoding/json"
	"errors"
	"os"
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
		if got, why := networkVerdict(c.mode == NetworkDisabled, c.obj); got != c.want || (got != netEnforced) == (why == "") {
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

// Agentbox.Allow narrows an allowed network to an allowlist (domain entries through the egress
// proxy beside address blocks); a disabled network stays None; a sandbox with the allowlist is
// held to the same fail-closed enforcement check as None.
func TestAllowNarrowsAnAllowedNetworkToAnAllowlist(t *testing.T) {
	allow := []agentbox.EgressAllow{
		{Domain: "pypi.org", Ports: []agentbox.EgressPort{{Port: 443}}},
		{Domain: "*.github.com"},
		{CIDR: "10.96.0.0/12", Ports: []agentbox.EgressPort{{Port: 53, Protocol: "UDP"}}},
		{Domain: "api.openai.com", Ports: []agentbox.EgressPort{{Port: 443}}, Credential: &agentbox.EgressCredential{SecretName: "model-key", Key: "token"}},
		{Domain: "api.example.com", Credential: &agentbox.EgressCredential{SecretName: "other-key", Key: "api_key.v1", Header: "X-Api-Key"}},
	}
	f := &Agentbox{Allow: allow}
	allowed := Policy{Network: NetworkPolicy{Mode: NetworkAllowAll}}
	disabled := Policy{Network: NetworkPolicy{Mode: NetworkDisabled}}
	got, err := json.Marshal(f.network(allowed))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"egress":"Allowlist","allow":[{"domain":"pypi.org","ports":[{"port":443}]},{"domain":"*.github.com"},{"cidr":"10.96.0.0/12","ports":[{"port":53,"protocol":"UDP"}]},` +
		`{"domain":"api.openai.com","ports":[{"port":443}],"credential":{"secretName":"model-key","key":"token"}},` +
		`{"domain":"api.example.com","credential":{"secretName":"other-key","key":"api_key.v1","header":"X-Api-Key"}}]}`
	if string(got) != want {
		t.Errorf("allowed with Allow:\n got %s\nwant %s", got, want)
	}
	if n := f.network(Policy{}); n.Egress != "Allowlist" {
		t.Errorf("the contract's default (allow_all): %+v", n)
	}
	if n := f.network(disabled); n.Egress != "None" || n.Allow != nil {
		t.Errorf("disabled: %+v", n)
	}
	if !f.reliesOnPolicy(allowed) || !f.reliesOnPolicy(disabled) || (&Agentbox{}).reliesOnPolicy(allowed) {
		t.Error("reliesOnPolicy: an allowlist and None rely on NetworkPolicy, All does not")
	}
	// The spec's allowlist is a copy: a later change of the factory's does not reach it.
	n := f.network(allowed)
	f.Allow[0].Domain = "evil.example"
	f.Allow[3].Credential.SecretName = "elsewhere"
	if n.Allow[0].Domain != "pypi.org" || n.Allow[3].Credential.SecretName != "model-key" {
		t.Error("the spec shares the factory's slice or credentials")
	}
	f.Allow[3].Credential.SecretName = "model-key"
	// An allowlisted sandbox the operator finds not enforced is refused, naming the cause.
	err = (&Agentbox{Allow: allow}).afterRecover(allowed, notEnforced, nil)
	var pe *PolicyCompatibilityError
	if !errors.As(err, &pe) || !strings.Contains(pe.Reason, "egress Allowlist") || !strings.Contains(pe.Reason, "NetworkPolicyNotEnforced") {
		t.Errorf("not enforced: %v", err)
	}
}

// A bad Agentbox.Allow is refused by Supported, naming the entry and the cause, before any
// request.
func TestSupportedRefusesABadAllowNamingIt(t *testing.T) {
	p := Policy{Filesystem: FilesystemPolicy{WorkingDir: "/workspace"}}
	for _, c := range []struct {
		allow agentbox.EgressAllow
		says  string
	}{
		{agentbox.EgressAllow{}, "Allow[0]: needs CIDR"},
		{agentbox.EgressAllow{CIDR: "10.0.0.0/8", Domain: "pypi.org"}, "either CIDR or Domain, not both"},
		{agentbox.EgressAllow{CIDR: "10.0.0.1"}, "CIDR notation"},
		{agentbox.EgressAllow{Domain: "PyPI.org"}, "Domain must be a lower-case DNS name"},
		{agentbox.EgressAllow{Domain: "localhost"}, "at least one dot"},
		{agentbox.EgressAllow{Domain: "10.0.0.1"}, "addresses go in CIDR"},
		{agentbox.EgressAllow{Domain: "a.*.example.com"}, "Domain must be"},
		{agentbox.EgressAllow{Domain: "pypi.org", Ports: []agentbox.EgressPort{{Port: 53, Protocol: "UDP"}}}, "Ports[0]: the ports of a domain entry are TCP"},
		{agentbox.EgressAllow{Domain: "pypi.org", Ports: []agentbox.EgressPort{{Port: 90, EndPort: 80}}}, "not a range"},
		// Credentials: the CRD's rules, in its words.
		{agentbox.EgressAllow{Domain: "*.openai.com", Credential: cred("model-key", "token", "")}, "Allow[0]: Credential: a credential goes with an exact domain"},
		{agentbox.EgressAllow{CIDR: "10.0.0.0/8", Credential: cred("model-key", "token", "")}, "not a CIDR or a '*.' wildcard"},
		{agentbox.EgressAllow{Domain: "api.openai.com", Credential: cred("", "token", "")}, `Credential.SecretName must be a Kubernetes object name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit, not ""`},
		{agentbox.EgressAllow{Domain: "api.openai.com", Credential: cred("Model_Key", "token", "")}, "Credential.SecretName must be"},
		{agentbox.EgressAllow{Domain: "api.openai.com", Credential: cred("model-key", "", "")}, `Credential.Key must be a Secret key: letters, digits, '-', '_' and '.', not ""`},
		{agentbox.EgressAllow{Domain: "api.openai.com", Credential: cred("model-key", "a/b", "")}, "Credential.Key must be"},
		{agentbox.EgressAllow{Domain: "api.openai.com", Credential: cred("model-key", "..", "")}, "Credential.Key must be"},
		{agentbox.EgressAllow{Domain: "api.openai.com", Credential: cred("model-key", "token", "Host")}, "Credential.Header must be an HTTP header name"},
		{agentbox.EgressAllow{Domain: "api.openai.com", Credential: cred("model-key", "token", "Proxy-Authorization")}, "Credential.Header must be"},
		{agentbox.EgressAllow{Domain: "api.openai.com", Credential: cred("model-key", "token", "X Key")}, "Credential.Header must be"},
		{agentbox.EgressAllow{Domain: "api.openai.com", Credential: cred("model-key", "token", strings.Repeat("a", 65))}, "Credential.Header must be"},
	} {
		err := (&Agentbox{Allow: []agentbox.EgressAllow{c.allow}}).Supported(p)
		if !errors.Is(err, agentbox.ErrInvalid) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%+v: %v, want %q", c.allow, err, c.says)
		}
	}
	ok := []agentbox.EgressAllow{
		{Domain: "*.github.com", Ports: []agentbox.EgressPort{{Port: 443, Protocol: "TCP"}}},
		{CIDR: "2001:db8::/32"},
		{Domain: "api.openai.com", Credential: cred("model-key", "token", "")},
		{Domain: "api.example.com", Credential: cred("k.v1", "api_key.v1", "X-Api-Key")},
	}
	if err := (&Agentbox{Allow: ok}).Supported(p); err != nil {
		t.Error(err)
	}
}

func cred(secret, key, header string) *agentbox.EgressCredential {
	return &agentbox.EgressCredential{SecretName: secret, Key: key, Header: header}
}

// The cross-language rule (tests/vectors/protocol.json, from EgressCredential::fault):
// Supported refuses exactly the credentials the CRD's rules refuse, naming the fault.
func TestCredentialsAreRefusedAsTheCRDsRulesRefuseThem(t *testing.T) {
	raw, err := os.ReadFile("../../tests/vectors/protocol.json")
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Credentials []struct {
			Domain     *string `json:"domain"`
			SecretName string  `json:"secretName"`
			Key        string  `json:"key"`
			Header     *string `json:"header"`
			Fault      *string `json:"fault"`
		} `json:"credentials"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Credentials) < 10 {
		t.Fatalf("%d credential vectors", len(v.Credentials))
	}
	words := map[string]string{
		"domain":      "a credential goes with an exact domain",
		"secret_name": "Credential.SecretName must be",
		"key":         "Credential.Key must be",
		"header":      "Credential.Header must be",
	}
	p := Policy{Filesystem: FilesystemPolicy{WorkingDir: "/workspace"}}
	for _, c := range v.Credentials {
		a := agentbox.EgressAllow{CIDR: "10.0.0.0/8", Credential: &agentbox.EgressCredential{SecretName: c.SecretName, Key: c.Key}}
		if c.Domain != nil {
			a.CIDR, a.Domain = "", *c.Domain
		}
		if c.Header != nil {
			if *c.Header == "" {
				// Go's "" is the default header; the empty header the vector means cannot be
				// said in Go (the json tag drops it), so it is never sent.
				continue
			}
			a.Credential.Header = *c.Header
		}
		err := (&Agentbox{Allow: []agentbox.EgressAllow{a}}).Supported(p)
		switch {
		case c.Fault == nil && err != nil:
			t.Errorf("%+v: refused: %v", c, err)
		case c.Fault != nil && (!errors.Is(err, agentbox.ErrInvalid) || !strings.Contains(err.Error(), words[*c.Fault])):
			t.Errorf("%+v: %v, want %q", c, err, words[*c.Fault])
		}
	}
}
