// Package anna is an agentbox backend for runners built on Stella's sandbox contract (the
// Go package pkg/sandbox of github.com/CherryHQ/stella; its "Anna" runner picks a backend by
// Factory and runs each run in a Session). Stella's module is not served, so its shapes are
// declared here, written from its public source and checked against a description of its
// declarations (stella_test.go names the files and commits); a runner written against
// Stella compiles against this package by changing the import path.
//
// Agentbox implements the contract on agentbox Sandboxes: Agentbox is the Factory, and
// Agentbox.Open gives the *AgentboxSession behind a Session, with what only agentbox has
// (FS: files including remove and mkdir; ResolvePath: a host path when the runner is on the
// sandbox's node).
package anna

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"time"

	agentbox "agentbox.dev/go"
)

// NetworkMode is a policy's network access.
type NetworkMode string

// The network modes.
const (
	// NetworkDisabled blocks all network access.
	NetworkDisabled NetworkMode = "disabled"
	// NetworkAllowAll allows unrestricted network access.
	NetworkAllowAll NetworkMode = "allow_all"
)

// MountWorkspace is where the workspace is in the sandbox, unless Agentbox.Root says
// otherwise.
const MountWorkspace = "/workspace"

// Policy is the immutable, backend-neutral policy a session is created with.
type Policy struct {
	// Filesystem is the session's filesystem view.
	Filesystem FilesystemPolicy
	// Network is its network access.
	Network NetworkPolicy
	// Env is added to every process's environment.
	Env map[string]string
	// InheritEnv asks for the runner's own environment in the sandbox's processes.
	InheritEnv bool
	// Timeout bounds each Exec (0: none).
	Timeout time.Duration
}

// FilesystemPolicy is the session's filesystem view.
type FilesystemPolicy struct {
	// Homes are persistent identities the runner attaches (opaque to backends).
	Homes []HomeAttachment
	// WorkingDir is the sandbox directory processes and relative paths start from.
	WorkingDir string
}

// HomeAttachment is one persistent identity of a FilesystemPolicy.
type HomeAttachment struct {
	HomeID   string
	Locator  string
	ReadOnly bool
}

// NetworkPolicy is the session's network access.
type NetworkPolicy struct {
	// Mode is NetworkDisabled or NetworkAllowAll ("" : NetworkAllowAll).
	Mode NetworkMode
	// Timeout bounds network operations (0: none).
	Timeout time.Duration
}

// Validate checks the policy's structure (not what a backend can honour): a known network
// mode and a working directory.
func (p Policy) Validate() error {
	switch p.Network.Mode {
	case "", NetworkDisabled, NetworkAllowAll:
	default:
		return fmt.Errorf("sandbox: invalid network mode %q", p.Network.Mode)
	}
	if p.Filesystem.WorkingDir == "" {
		return errors.New("sandbox: working directory is required")
	}
	return nil
}

// NetworkModeOrDefault is the network mode, NetworkAllowAll when unset.
func (p Policy) NetworkModeOrDefault() NetworkMode {
	if p.Network.Mode == "" {
		return NetworkAllowAll
	}
	return p.Network.Mode
}

// PolicyCompatibilityError is a policy the backend cannot honour; the runner does not start
// (no silent downgrade). Reason names the policy's field.
type PolicyCompatibilityError struct {
	Backend string
	Policy  Policy
	Reason  string
}

func (e *PolicyCompatibilityError) Error() string {
	return fmt.Sprintf("sandbox: backend %q cannot satisfy policy: %s", e.Backend, e.Reason)
}

// IsPolicyCompatibilityError reports whether err is (or wraps) a PolicyCompatibilityError.
func IsPolicyCompatibilityError(err error) bool {
	var pe *PolicyCompatibilityError
	return errors.As(err, &pe)
}

// Factory makes sessions of one backend.
type Factory interface {
	CreateSession(ctx context.Context, policy Policy) (Session, error)
	Supported(policy Policy) error
	Name() string
	Available() bool
}

// Session is one run's execution boundary.
type Session interface {
	Policy() Policy
	Close() error
	Alive() bool
	Done() <-chan struct{}
	Exec(ctx context.Context, command string, opts ExecOptions) (ExecResult, error)
	StartProcess(ctx context.Context, req ProcessRequest) (ProcessHandle, error)
	// Files is the session's file access, in sandbox paths (as WorkingDir).
	Files() FileAccess
	WorkingDir() string
}

// EnvRefresher is a session whose injected environment can change after it started (a
// rotated credential): later Exec and StartProcess calls see the updates.
type EnvRefresher interface {
	RefreshEnv(updates map[string]string)
}

// ExecOptions are the settings of one Exec.
type ExecOptions struct {
	Cwd     string            // "" : the session's working directory
	Env     map[string]string // added to the policy's
	Timeout time.Duration     // 0 : the policy's
}

// ExecResult is a finished command.
type ExecResult struct {
	Stdout   string
	Stderr   string
	ExitCode int
}

// ProcessRequest is a long-lived process to start: Path with Args (an argv, no shell).
type ProcessRequest struct {
	Path    string
	Args    []string
	Cwd     string
	Env     map[string]string
	Timeout time.Duration // 0 : none
}

// ProcessHandle is a started process with its stdio.
type ProcessHandle interface {
	PID() int
	Wait(ctx context.Context) (ExecResult, error)
	Stdin() io.WriteCloser
	Stdout() io.ReadCloser
	Stderr() io.ReadCloser
	Close() error
}

// DirEntry is one entry of a directory listing.
type DirEntry struct {
	Name  string
	IsDir bool
	Size  int64
}

// FileInfo is what Stat says of a path.
type FileInfo struct {
	IsDir bool
	Size  int64
}

// ProjectedFile is one file of a projection (FileAccess.ProjectFiles).
type ProjectedFile struct {
	Path    string
	Content []byte
	Mode    fs.FileMode
}

// ErrProjectionConflict is a projected path that exists with other content or mode.
var ErrProjectionConflict = errors.New("sandbox: projection conflicts with exact files")

// FileAccess is a session's file access, in the sandbox's paths.
type FileAccess interface {
	ReadFile(path string) ([]byte, error)
	ReadDir(path string) ([]DirEntry, error)
	Stat(path string) (FileInfo, error)
	WriteFile(path string, content []byte, mode fs.FileMode) error
	// ProjectFiles writes files under path (each Path relative to it), refusing with
	// ErrProjectionConflict one that exists with other content or mode.
	ProjectFiles(path string, files []ProjectedFile) error
}

// ErrNoHostPath says ResolvePath has no host path to give: the sandbox's workspace is not on
// this host (the runner is not on the sandbox's node). Use Files() or FS().
var ErrNoHostPath = errors.New("the sandbox's workspace is not on this host; use the session's Files() or FS()")

// ErrClosed is an operation on a closed session.
var ErrClosed = errors.New("the session is closed")

// ErrOutputTruncated is an Exec whose stdout or stderr was longer than the cap
// (Agentbox.MaxOutput): the error is an *agentbox.OutputTruncatedError, and the ExecResult
// returned with it has the output up to the cap.
var ErrOutputTruncated = agentbox.ErrOutputTruncated
