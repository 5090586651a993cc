package agentbox

import (
	"fmt"
	"strings"
)

// The sentinel errors (ErrInvalid, ErrNotFound, ...) and KindOf are generated from the Rust
// crate's table of error kinds into kinds.go.

func invalidf(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, a...))
}

func protocolf(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrProtocol, fmt.Sprintf(format, a...))
}

// APIError is a refusal of the API server (Is ErrNotFound for 404, ErrConflict for 409,
// ErrInvalidSpec and ErrAPI for 422, else ErrAPI).
type APIError struct {
	Code    int
	Reason  string
	Message string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("agentbox: API server: %d %s: %s", e.Code, e.Reason, e.Message)
}

// Is matches the sentinel of the status code.
func (e *APIError) Is(t error) bool {
	switch e.Code {
	case 404:
		return t == ErrNotFound
	case 409:
		return t == ErrConflict
	case 422:
		return t == ErrInvalidSpec || t == ErrAPI
	}
	return t == ErrAPI
}

// PathError is a workspace path refused: Reason is "DotDot", "OutsideRoot", "Invalid" (by the
// client, before any request) or "Escapes" (in the pod: a symlink leads out).
type PathError struct {
	Path   string
	Reason string
	Msg    string
}

func (e *PathError) Error() string { return "agentbox: " + e.Msg }

// Is matches ErrPath.
func (e *PathError) Is(t error) bool { return t == ErrPath }

// OutputCutError says which stream ended without its trailer and how much of it arrived.
type OutputCutError struct {
	Stream   string // "stdout" or "stderr"
	Received int64  // bytes of that stream received (the trailer's start included)
}

func (e *OutputCutError) Error() string {
	return fmt.Sprintf("agentbox: %s was cut: the stream ended without its trailer after %d bytes", e.Stream, e.Received)
}

// Is matches ErrOutputCut.
func (e *OutputCutError) Is(t error) bool { return t == ErrOutputCut }

// ExecTimeoutError is a command killed at its timeout. Result holds the output until then and
// the exit status after the kill; nil when no status arrived at all.
type ExecTimeoutError struct {
	Timeout float64
	Result  *ExecResult
}

func (e *ExecTimeoutError) Error() string {
	if e.Result == nil {
		return fmt.Sprintf("agentbox: command timed out after %gs and no exit status arrived", e.Timeout)
	}
	return fmt.Sprintf("agentbox: command timed out after %gs", e.Timeout)
}

// Is matches ErrExecTimeout.
func (e *ExecTimeoutError) Is(t error) bool { return t == ErrExecTimeout }

// CommandError is a non-zero exit where success was required.
type CommandError struct{ Result *ExecResult }

func (e *CommandError) Error() string {
	msg := e.Result.Stderr
	if len(msg) > 500 {
		msg = msg[len(msg)-500:]
	}
	return fmt.Sprintf("agentbox: command exited with code %d: %s", e.Result.ExitCode, msg)
}

// Is matches ErrCommand.
func (e *CommandError) Is(t error) bool { return t == ErrCommand }

// OutputTruncatedError is a command whose stdout or stderr was longer than its cap: Result
// has the first Limit bytes of each (and its exit code); the rest was dropped.
type OutputTruncatedError struct {
	Limit  int
	Result *ExecResult
}

func (e *OutputTruncatedError) Error() string {
	var s []string
	if e.Result.StdoutTruncated {
		s = append(s, "stdout")
	}
	if e.Result.StderrTruncated {
		s = append(s, "stderr")
	}
	return fmt.Sprintf("agentbox: %s longer than the cap of %d bytes (raise ExecOptions.MaxOutput); the rest was dropped", strings.Join(s, " and "), e.Limit)
}

// Is matches ErrOutputTruncated.
func (e *OutputTruncatedError) Is(t error) bool { return t == ErrOutputTruncated }

// SandboxError says why a Sandbox is not serving: its phase and the failing condition's
// reason and message. Kind is one of ErrSandboxFailed, ErrSandboxSuspended,
// ErrSandboxNotReady, ErrSandboxNotDeleted.
type SandboxError struct {
	Kind    error
	Name    string
	Phase   string
	Reason  string
	Message string
}

func (e *SandboxError) Error() string {
	return fmt.Sprintf("%v: %s (phase %q, reason %q): %s", e.Kind, e.Name, e.Phase, e.Reason, e.Message)
}

// Is matches its Kind.
func (e *SandboxError) Is(t error) bool { return t == e.Kind }

// SnapshotError says why a snapshot failed or is not usable.
type SnapshotError struct {
	Name, Phase, Reason, Message string
}

func (e *SnapshotError) Error() string {
	return fmt.Sprintf("agentbox: snapshot %s (phase %q, reason %q): %s", e.Name, e.Phase, e.Reason, e.Message)
}

// Is matches ErrSnapshotFailed.
func (e *SnapshotError) Is(t error) bool { return t == ErrSnapshotFailed }

// GuardError is a guard that timed out (Holder: who held it) or was lost.
type GuardError struct {
	Kind   error // ErrGuardTimeout or ErrGuardLost
	Lease  string
	Holder string
}

func (e *GuardError) Error() string {
	if e.Kind == ErrGuardTimeout {
		return fmt.Sprintf("%v: lease %s still held by %q", e.Kind, e.Lease, e.Holder)
	}
	return fmt.Sprintf("%v: lease %s", e.Kind, e.Lease)
}

// Is matches its Kind.
func (e *GuardError) Is(t error) bool { return t == e.Kind }

// RemoteError is a file script that failed in the pod.
type RemoteError struct {
	ExitCode int
	Stderr   string
}

func (e *RemoteError) Error() string {
	switch e.ExitCode {
	case ExitSpoolFailed:
		return fmt.Sprintf("%v: %s", ErrUploadSpool, e.Stderr)
	case ExitUploadTooLarge:
		return fmt.Sprintf("%v: %s", ErrUploadTooLarge, e.Stderr)
	}
	return fmt.Sprintf("agentbox: remote command exited %d: %s", e.ExitCode, e.Stderr)
}

// Is matches ErrRemote, ErrUploadSpool for an upload whose spool failed, and ErrUploadTooLarge
// for one that would pass the workspace's size limit.
func (e *RemoteError) Is(t error) bool {
	return t == ErrRemote || (t == ErrUploadSpool && e.ExitCode == ExitSpoolFailed) ||
		(t == ErrUploadTooLarge && e.ExitCode == ExitUploadTooLarge)
}

// OutOfMemoryError: a command killed for memory (Is ErrOutOfMemory). Container is true when the
// whole sandbox container was killed (the kubelet recorded it OOMKilled while the command ran:
// every process in it, sessions too), false when the kernel's OOM killer ended the command
// alone (exit code 137 with the container's OOM kill counter risen). Raise the sandbox's
// resources.limits.memory, or make the command use less.
type OutOfMemoryError struct {
	Container bool
}

func (e *OutOfMemoryError) Error() string {
	if e.Container {
		return "agentbox: out of memory: the sandbox's container was killed for memory (OOMKilled) while the command ran, and every process in it with it; raise the sandbox's resources.limits.memory"
	}
	return "agentbox: out of memory: the command was killed for memory (the kernel's OOM killer, exit code 137) when its container reached its memory limit; raise the sandbox's resources.limits.memory"
}

// Is matches ErrOutOfMemory.
func (e *OutOfMemoryError) Is(t error) bool { return t == ErrOutOfMemory }
