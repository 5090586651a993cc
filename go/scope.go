package agentbox

import "fmt"

// ScopeKind is the kind of an isolation scope (the CRD's scope.kind).
type ScopeKind string

// The scope kinds.
const (
	ScopeSession ScopeKind = "Session" // one session of an agent: Agent and Session
	ScopeUser    ScopeKind = "User"    // one user of an agent, across sessions: Agent and User
	ScopeAgent   ScopeKind = "Agent"   // one agent, shared by its users: Agent
	ScopeGlobal  ScopeKind = "Global"  // one lineage for everything: no ids
)

// MaxID is the longest id the CRD accepts.
const MaxID = 253

// Scope is an isolation scope: which ids identify a sandbox's lineage (spec.scope). Ids are
// any strings of 1 to 253 bytes; they need not be valid label values.
type Scope struct {
	Kind    ScopeKind `json:"kind"`
	Agent   string    `json:"agent,omitempty"`
	User    string    `json:"user,omitempty"`
	Session string    `json:"session,omitempty"`
}

// SessionScope is one session of an agent.
func SessionScope(agent, session string) Scope {
	return Scope{Kind: ScopeSession, Agent: agent, Session: session}
}

// UserScope is one user of an agent, across sessions.
func UserScope(agent, user string) Scope { return Scope{Kind: ScopeUser, Agent: agent, User: user} }

// AgentScope is one agent, shared by all its users.
func AgentScope(agent string) Scope { return Scope{Kind: ScopeAgent, Agent: agent} }

// GlobalScope is the single global lineage.
func GlobalScope() Scope { return Scope{Kind: ScopeGlobal} }

// LabelValue is the lower-case kind of the agentbox.dev/scope label.
func (k ScopeKind) LabelValue() string {
	switch k {
	case ScopeSession:
		return "session"
	case ScopeUser:
		return "user"
	case ScopeAgent:
		return "agent"
	case ScopeGlobal:
		return "global"
	}
	return ""
}

// Validate checks the scope with the CRD's rules, so a bad scope fails before any request
// (ErrInvalid).
func (s Scope) Validate() error {
	var need [3]bool // agent, user, session
	switch s.Kind {
	case ScopeSession:
		need = [3]bool{true, false, true}
	case ScopeUser:
		need = [3]bool{true, true, false}
	case ScopeAgent:
		need = [3]bool{true, false, false}
	case ScopeGlobal:
	default:
		return invalidf("scope.kind must be one of Session, User, Agent, Global, not %q", s.Kind)
	}
	for i, f := range []struct{ name, v string }{{"agent", s.Agent}, {"user", s.User}, {"session", s.Session}} {
		switch {
		case need[i] && f.v == "":
			return invalidf("scope.%s is required for a %s scope", f.name, s.Kind)
		case need[i] && len(f.v) > MaxID:
			return invalidf("scope.%s must be a string of 1 to %d characters", f.name, MaxID)
		case !need[i] && f.v != "":
			return invalidf("scope.%s is not used by a %s scope", f.name, s.Kind)
		}
	}
	return nil
}

// ids are the ids that identify a scope of its kind (agent, user, session); nil: absent.
func (s Scope) ids() [3]*string {
	a, u, se := s.Agent, s.User, s.Session
	switch s.Kind {
	case ScopeSession:
		return [3]*string{&a, nil, &se}
	case ScopeUser:
		return [3]*string{&a, &u, nil}
	case ScopeAgent:
		return [3]*string{&a, nil, nil}
	}
	return [3]*string{}
}

// String is a readable form of the scope.
func (s Scope) String() string {
	return fmt.Sprintf("%s(agent=%q user=%q session=%q)", s.Kind, s.Agent, s.User, s.Session)
}
