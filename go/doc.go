// Package agentbox is the Go client of agentbox: get or create the Sandbox of a scope, wait
// until it is Ready, run commands in it (one-shot or in a persistent shell), move files in and
// out of its workspace, hold its scope's guard (a Lease), take and restore snapshots.
//
// It speaks the protocol every agentbox client speaks (docs/protocol.md), checked byte for
// byte against tests/vectors/protocol.json: a Go harness, a Rust one, a Python one and the
// operator see the same Sandbox, Lease and labels for one scope.
package agentbox
