// Package anna is an agentbox backend for harnesses built on the Anna runner's sandbox
// contract (its pkg/sandbox): a per-run Session with exactly eight methods, picked by a
// Factory. Anna's own module is not a dependency: the shapes are declared here as that
// contract states them, and implemented on agentbox Sandboxes.
package anna

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"time"
)

// NetworkMode is a policy's network access.
type NetworkMode string

// The network modes.
const (
	NetworkFull      NetworkMode = "full"      // any egress
	NetworkNone      NetworkMode = "none"      // no egress
	NetworkAllowlist NetworkMode = "allowlist" // egress to AllowedHosts only
)

// Policy is the immutable policy a session is created with.
type Policy struct {
	// FilesystemRoot is the root the session's files live under, in the sandbox ("" is
	// /workspace).
	FilesystemRoot string
	// WorkingDir is the logical working directory, relative to the root or absolute under it
	// ("" is the root).
	WorkingDir string
	// Network is the network mode ("" is NetworkFull).
	Network NetworkMode
	// AllowedHosts are the hosts of NetworkAllowlist.
	AllowedHosts []string
	// Env is added to every command's environment.
	Env map[string]string
	// Timeout is the default timeout of a command (0: none).
	Timeout time.Duration
	// ReadOnlyPaths are paths under the root the session must not write.
	ReadOnlyPaths []string
}

// ExecOptions are the settings of one command.
type ExecOptions struct {
	Stdin      io.Reader
	Env        map[string]string
	WorkingDir string        // "" : the session's
	Timeout    time.Duration // 0 : the policy's
}

// ExecResult is a finished command.
type ExecResult struct {
	ExitCode int
	Stdout   []byte
	Stderr   []byte
	TimedOut bool
	Duration time.Duration
}

// ProcessRequest is a long-lived process to start.
type ProcessRequest struct {
	Command    []string
	Env        map[string]string
	WorkingDir string
}

// ProcessHandle is a started process with its stdio.
type ProcessHandle interface {
	Stdin() io.WriteCloser
	Stdout() io.Reader
	Stderr() io.Reader
	// Wait returns the exit code once the process ended.
	Wait() (int, error)
	// Kill ends the process (closing its stdin and connection).
	Kill() error
}

// Session is one run's execution boundary: exactly these eight methods.
type Session interface {
	Policy() Policy
	Exec(ctx context.Context, command string, opts ExecOptions) (ExecResult, error)
	StartProcess(ctx context.Context, req ProcessRequest) (ProcessHandle, error)
	ResolvePath(path string) (string, error)
	WorkingDir() string
	Close() error
	Alive() bool
	Done() <-chan struct{}
}

// FileSystem is the file access of newer runners (Session.Files()), which suits a remote
// backend better than ResolvePath.
type FileSystem interface {
	ReadFile(name string) ([]byte, error)
	ReadDir(name string) ([]fs.DirEntry, error)
	Stat(name string) (fs.FileInfo, error)
	WriteFile(name string, data []byte, perm fs.FileMode) error
}

// Factory makes sessions of one backend.
type Factory interface {
	Name() string
	Available() bool
	Supported(p Policy) error
	CreateSession(ctx context.Context, p Policy) (Session, error)
}

// PolicyCompatibilityError is a policy the backend cannot honour; the runner does not start
// (no silent downgrade).
type PolicyCompatibilityError struct {
	Backend string
	Field   string
	Reason  string
}

func (e *PolicyCompatibilityError) Error() string {
	return fmt.Sprintf("sandbox backend %s cannot honour Policy.%s: %s", e.Backend, e.Field, e.Reason)
}

// ErrNoHostPath says ResolvePath has no host path to give: use Files().
var ErrNoHostPath = errors.New("the sandbox's workspace is not on this host; use Files()")

// ErrClosed is an operation on a closed session.
var ErrClosed = errors.New("the session is closed")
