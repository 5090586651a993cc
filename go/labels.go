package agentbox

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strings"
)

// Label and annotation keys, the same as every other agentbox client's.
const (
	LabelScope     = "agentbox.dev/scope"           // scope kind (session, user, agent, global)
	LabelScopeKey  = "agentbox.dev/scope-key"       // the scope key (ScopeKey)
	LabelAgent     = "agentbox.dev/agent"           // readable agent id, when a valid label value
	LabelUser      = "agentbox.dev/user"            // readable user id, when a valid label value
	LabelSession   = "agentbox.dev/session"         // readable session id, when a valid label value
	LabelSandbox   = "agentbox.dev/sandbox"         // the Sandbox an object belongs to
	LabelManagedBy = "app.kubernetes.io/managed-by" // the standard managed-by label
	Manager        = "agentbox"                     // value of LabelManagedBy
	AnnotAgentID   = "agentbox.dev/agent-id"        // raw agent id
	AnnotUserID    = "agentbox.dev/user-id"         // raw user id
	AnnotSessionID = "agentbox.dev/session-id"      // raw session id
	ScopeKeyLen    = 40                             // hex characters of a scope key
	MaxLabel       = 63                             // longest label value and DNS-1123 label
)

// ScopeKey is the hex SHA-256 over a versioned tag, the kind and each id (length-prefixed, so
// "a"+"bc" and "ab"+"c" differ), truncated to 40 characters.
func ScopeKey(s Scope) string {
	h := sha256.New()
	h.Write([]byte("agentbox.dev/scope-key/v1\x00"))
	h.Write([]byte(s.Kind.LabelValue()))
	for _, v := range s.ids() {
		if v == nil {
			h.Write([]byte{0})
			continue
		}
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(*v)))
		h.Write([]byte{1})
		h.Write(n[:])
		h.Write([]byte(*v))
	}
	return hex.EncodeToString(h.Sum(nil))[:ScopeKeyLen]
}

func alnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// IsValidLabelValue reports whether v is a valid Kubernetes label value (empty, or up to 63
// characters of [A-Za-z0-9._-] starting and ending with an alphanumeric).
func IsValidLabelValue(v string) bool {
	if v == "" {
		return true
	}
	if len(v) > MaxLabel || !alnum(v[0]) || !alnum(v[len(v)-1]) {
		return false
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; !alnum(c) && c != '.' && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

// ScopeLabels are the labels every object of a scope carries: kind, key, managed-by, and the
// readable ids that are valid non-empty label values.
func ScopeLabels(s Scope) map[string]string {
	l := map[string]string{LabelScope: s.Kind.LabelValue(), LabelScopeKey: ScopeKey(s), LabelManagedBy: Manager}
	for i, k := range []string{LabelAgent, LabelUser, LabelSession} {
		if v := s.ids()[i]; v != nil && *v != "" && IsValidLabelValue(*v) {
			l[k] = *v
		}
	}
	return l
}

// ScopeAnnotations hold the raw ids of a scope.
func ScopeAnnotations(s Scope) map[string]string {
	a := map[string]string{}
	for i, k := range []string{AnnotAgentID, AnnotUserID, AnnotSessionID} {
		if v := s.ids()[i]; v != nil {
			a[k] = *v
		}
	}
	return a
}

// ScopeSelector is a label selector matching every object of a scope.
func ScopeSelector(s Scope) string { return LabelScopeKey + "=" + ScopeKey(s) }

// BoundedName is base when it fits in max bytes; else a prefix, "-" and 16 hex characters of
// its SHA-256 (the prefix trimmed of trailing "-" and "."), so long names stay distinct.
func BoundedName(base string, max int) string {
	if len(base) <= max {
		return base
	}
	sum := sha256.Sum256([]byte(base))
	n := max - 17
	if n < 0 {
		n = 0
	}
	// A prefix of characters, as the Rust and Python clients cut it.
	r := []rune(base)
	if n > len(r) {
		n = len(r)
	}
	prefix := strings.TrimRight(string(r[:n]), "-.")
	return prefix + "-" + hex.EncodeToString(sum[:])[:16]
}

// SandboxNameForScope is the Sandbox name of a scope (deterministic, so racing creators in any
// language get one object).
func SandboxNameForScope(s Scope) string { return s.Kind.LabelValue() + "-" + ScopeKey(s)[:24] }

// PodName is the pod name of a sandbox.
func PodName(sandbox string) string { return BoundedName("sbx-"+sandbox, MaxLabel) }

// SandboxLabelValue is the LabelSandbox value of a sandbox.
func SandboxLabelValue(sandbox string) string { return BoundedName(sandbox, MaxLabel) }

// LeaseName is the guard Lease name of a scope key.
func LeaseName(key string) string { return "agentbox-guard-" + key }
