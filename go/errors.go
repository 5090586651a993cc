package agentbox

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors: every error this package returns matches one of them with errors.Is, and
// the typed ones below carry the details (errors.As).
var (
	// ErrInvalid: a request refused before anything was sent (bad scope, argv, env name...).
	ErrInvalid = errors.New("agentbox: invalid request")
	// ErrNotFound: the object does not exist (API 404).
	ErrNotFound = errors.New("agentbox: not found")
	// ErrConflict: the API server refused a write that lost a race (409).
	ErrConflict = errors.New("agentbox: conflict")
	// ErrAPI: any other refusal of the API server.
	ErrAPI = errors.New("agentbox: API error")
	// ErrTransport: the API server or the exec stream could not be reached or broke.
	ErrTransport = errors.New("agentbox: transport error")
	// ErrProtocol: the server said something this client cannot read.
	ErrProtocol = errors.New("agentbox: protocol error")
	// ErrPath: a workspace path refused (PathError says why).
	ErrPath = errors.New("agentbox: path refused")
	// ErrOutputCut: an exec stream ended without its trailer: output was lost on the way.
	ErrOutputCut = errors.New("agentbox: output cut")
	// ErrOutputTruncated: a command printed more than its cap (ExecOptions.MaxOutput) and
	// ExecOptions.FailTruncated asked for an error (OutputTruncatedError, with the result).
	ErrOutputTruncated = errors.New("agentbox: output truncated")
	// ErrExecTimeout: the command's timeout passed and it was killed (ExecTimeoutError).
	ErrExecTimeout = errors.New("agentbox: command timed out")
	// ErrCommandNotStarted: the runtime could not start the command.
	ErrCommandNotStarted = errors.New("agentbox: command not started")
	// ErrCommand: a command exited non-zero where success was required (CommandError).
	ErrCommand = errors.New("agentbox: command failed")
	// ErrOutOfMemory: the command was killed for memory (OutOfMemoryError): the kernel's OOM
	// killer ended it when its container reached its memory limit, or the whole sandbox
	// container was killed for memory (the kubelet's OOMKilled) while it ran.
	ErrOutOfMemory = errors.New("agentbox: out of memory")
	// ErrSession: the persistent shell died while a command ran.
	ErrSession = errors.New("agentbox: session error")
	// ErrSandboxFailed: the Sandbox failed or its start is Stalled (SandboxError).
	ErrSandboxFailed = errors.New("agentbox: sandbox failed")
	// ErrSandboxSuspended: the Sandbox's spec suspends it (SandboxError).
	ErrSandboxSuspended = errors.New("agentbox: sandbox suspended")
	// ErrSandboxNotReady: the wait for Ready timed out (SandboxError).
	ErrSandboxNotReady = errors.New("agentbox: sandbox not ready")
	// ErrSandboxNotDeleted: the Sandbox still exists after the wait (SandboxError).
	ErrSandboxNotDeleted = errors.New("agentbox: sandbox not deleted")
	// ErrScopeMismatch: the scope's Sandbox name holds a Sandbox of another scope.
	ErrScopeMismatch = errors.New("agentbox: scope mismatch")
	// ErrGuardTimeout: the scope's guard stayed held by another until the deadline.
	ErrGuardTimeout = errors.New("agentbox: guard timeout")
	// ErrGuardLost: the guard was lost (taken over, deleted, or not renewed in time).
	ErrGuardLost = errors.New("agentbox: guard lost")
	// ErrSnapshotFailed: a snapshot failed, was not Ready in time, or cannot be restored.
	ErrSnapshotFailed = errors.New("agentbox: snapshot failed")
	// ErrFileNotFound: a workspace path is missing or of the wrong type.
	ErrFileNotFound = errors.New("agentbox: file not found")
	// ErrFileTooLarge: a file is larger than the read cap.
	ErrFileTooLarge = errors.New("agentbox: file too large")
	// ErrRemote: a file script failed in the pod (RemoteError has its exit code).
	ErrRemote = errors.New("agentbox: remote error")
	// ErrUploadSpool: a directory upload's archive could not be written to its spool in the
	// pod, most often because the workspace's disk is full; nothing was extracted (a
	// RemoteError with ExitSpoolFailed, so also ErrRemote).
	ErrUploadSpool = errors.New("agentbox: upload could not be spooled (is the workspace's disk full?)")
)

func invalidf(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, a...))
}

func protocolf(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrProtocol, fmt.Sprintf(format, a...))
}

// APIError is a refusal of the API server (Is ErrNotFound for 404, ErrConflict for 409, else
// ErrAPI).
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
	if e.ExitCode == ExitSpoolFailed {
		return fmt.Sprintf("%v: %s", ErrUploadSpool, e.Stderr)
	}
	return fmt.Sprintf("agentbox: remote command exited %d: %s", e.ExitCode, e.Stderr)
}

// Is matches ErrRemote, and ErrUploadSpool for an upload whose spool failed.
func (e *RemoteError) Is(t error) bool {
	return t == ErrRemote || (t == ErrUploadSpool && e.ExitCode == ExitSpoolFailed)
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
