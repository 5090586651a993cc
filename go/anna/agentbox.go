package anna

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	agentbox "agentbox.dev/go"
)

// Agentbox is the Factory of agentbox sessions: each session is the Sandbox of Scope
// (created on first use, found again by a later session of the same scope, its workspace
// kept), held under the scope's guard for the session's run.
type Agentbox struct {
	// Sandboxes is the namespace the sandboxes live in.
	Sandboxes *agentbox.Sandboxes
	// Scope is the isolation scope of the sessions.
	Scope agentbox.Scope
	// Image is the sandbox image; ImagePullPolicy its pull policy ("" : the cluster's).
	Image           string
	ImagePullPolicy string
	// ReadyTimeout bounds the wait for the sandbox (0 : 2 minutes).
	ReadyTimeout time.Duration
	// Guard configures the scope's guard; Guard.Wait bounds the wait for another session of
	// the scope to end (0 : 30 s).
	Guard agentbox.GuardConfig
}

// Name is "agentbox".
func (f *Agentbox) Name() string { return "agentbox" }

// Available reports whether the cluster answers and serves Sandboxes.
func (f *Agentbox) Available() bool {
	if f.Sandboxes == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return f.Sandboxes.Ping(ctx) == nil
}

func (f *Agentbox) incompatible(field, reason string) error {
	return &PolicyCompatibilityError{Backend: f.Name(), Field: field, Reason: reason}
}

func root(p Policy) string {
	if p.FilesystemRoot == "" {
		return "/workspace"
	}
	return p.FilesystemRoot
}

// Supported says whether agentbox can honour p (a PolicyCompatibilityError naming the field
// when not).
func (f *Agentbox) Supported(p Policy) error {
	r := root(p)
	if !strings.HasPrefix(r, "/") || strings.Contains("/"+r+"/", "/../") {
		return f.incompatible("FilesystemRoot", "must be an absolute path without '..'")
	}
	if _, err := agentbox.Confine(r, p.WorkingDir); err != nil {
		return f.incompatible("WorkingDir", err.Error())
	}
	switch p.Network {
	case "", NetworkFull, NetworkNone:
		if len(p.AllowedHosts) > 0 {
			return f.incompatible("AllowedHosts", "applies only with the allowlist network mode")
		}
	case NetworkAllowlist:
		if len(p.AllowedHosts) == 0 {
			return f.incompatible("AllowedHosts", "the allowlist network mode needs at least one entry")
		}
		for _, h := range p.AllowedHosts {
			if _, err := allowEntry(h); err != nil {
				return f.incompatible("AllowedHosts", err.Error())
			}
		}
	default:
		return f.incompatible("Network", fmt.Sprintf("unknown mode %q", p.Network))
	}
	if len(p.ReadOnlyPaths) > 0 {
		return f.incompatible("ReadOnlyPaths", "the workspace is writable as a whole")
	}
	for k := range p.Env {
		if !agentbox.IsEnvName(k) {
			return f.incompatible("Env", fmt.Sprintf("%q is not an environment variable name", k))
		}
	}
	if p.Timeout < 0 {
		return f.incompatible("Timeout", "must not be negative")
	}
	return nil
}

// egress maps p's network mode to the sandbox's: no outbound network unless the policy says
// otherwise (the contract's default), so "" is "None" too. The operator holds the sandbox
// not Ready where it cannot prove the policy is enforced, so CreateSession fails closed there.
func egress(p Policy) string {
	switch p.Network {
	case NetworkFull:
		return "All"
	case NetworkAllowlist:
		return "Allowlist"
	default:
		return "None"
	}
}

// allowEntry is an AllowedHosts entry as an allowlist entry: an address (a /32 or /128 block)
// or an address block, every port. Host names are refused: agentbox's allowlists are by
// address until its egress proxy takes domains.
func allowEntry(h string) (agentbox.EgressAllow, error) {
	if ip := net.ParseIP(h); ip != nil {
		bits := 32
		if ip.To4() == nil {
			bits = 128
		}
		return agentbox.EgressAllow{CIDR: fmt.Sprintf("%s/%d", ip, bits)}, nil
	}
	if _, block, err := net.ParseCIDR(h); err == nil {
		return agentbox.EgressAllow{CIDR: block.String()}, nil
	}
	return agentbox.EgressAllow{}, fmt.Errorf("%q is not an address or CIDR block: host names are not enforced", h)
}

// network is p's network as a sandbox spec's.
func network(p Policy) *agentbox.NetworkSpec {
	n := &agentbox.NetworkSpec{Egress: egress(p)}
	if n.Egress == "Allowlist" {
		for _, h := range p.AllowedHosts {
			if a, err := allowEntry(h); err == nil {
				n.Allow = append(n.Allow, a)
			}
		}
	}
	return n
}

// CreateSession gets or creates the scope's Sandbox for p, takes the scope's guard, waits
// until the sandbox is Ready and starts its persistent shell.
func (f *Agentbox) CreateSession(ctx context.Context, p Policy) (Session, error) {
	if err := f.Supported(p); err != nil {
		return nil, err
	}
	spec := agentbox.SandboxSpec{
		Image:           f.Image,
		ImagePullPolicy: f.ImagePullPolicy,
		Workspace:       &agentbox.WorkspaceSpec{Root: root(p)},
		Network:         network(p),
	}
	sbx, err := f.Sandboxes.GetOrCreate(ctx, f.Scope, spec)
	if err != nil {
		return nil, err
	}
	// A sandbox made earlier for the scope under another policy would not honour this one.
	if got := sbx.WorkspaceRoot(); got != root(p) {
		return nil, f.incompatible("FilesystemRoot", fmt.Sprintf("the scope's sandbox %s has its workspace at %s", sbx.Name(), got))
	}
	if got := sbx.Egress(); got != egress(p) {
		return nil, f.incompatible("Network", fmt.Sprintf("the scope's sandbox %s has egress %s", sbx.Name(), got))
	}
	gcfg := f.Guard
	if gcfg.Wait == 0 {
		gcfg.Wait = 30 * time.Second
	}
	g := sbx.Guard(gcfg)
	if err := g.Acquire(ctx); err != nil {
		return nil, err
	}
	s, err := f.start(ctx, p, sbx, g)
	if err != nil {
		_ = g.Release(context.Background())
		return nil, err
	}
	return s, nil
}

func (f *Agentbox) start(ctx context.Context, p Policy, sbx *agentbox.Sandbox, g *agentbox.Guard) (*session, error) {
	wait := f.ReadyTimeout
	if wait == 0 {
		wait = 2 * time.Minute
	}
	// Recover, not only WaitReady: a status still Ready from a pod being deleted (the last
	// session's end) is not a sandbox that serves.
	if err := sbx.Recover(ctx, wait); err != nil {
		return nil, err
	}
	wd, err := agentbox.Confine(root(p), p.WorkingDir)
	if err != nil {
		return nil, f.incompatible("WorkingDir", err.Error())
	}
	life, stop := context.WithCancel(g.Context())
	gone, err := sbx.Gone(life)
	if err != nil {
		stop()
		return nil, err
	}
	sh := sbx.Session(wd)
	if wd != sbx.WorkspaceRoot() {
		if err := sbx.Mkdir(ctx, wd); err != nil {
			stop()
			return nil, err
		}
	}
	if err := sh.Start(ctx); err != nil {
		stop()
		return nil, err
	}
	host, err := sbx.HostDir(ctx)
	if err != nil {
		stop()
		return nil, err
	}
	s := &session{policy: p, sbx: sbx, guard: g, shell: sh, wd: wd, host: host, life: life, stop: stop, done: make(chan struct{})}
	go func() {
		select {
		case <-gone:
		case <-life.Done():
		}
		s.end()
	}()
	return s, nil
}

type session struct {
	policy Policy
	sbx    *agentbox.Sandbox
	guard  *agentbox.Guard
	shell  *agentbox.Session
	wd     string
	host   string // the workspace's directory on the node ("" : unknown)
	life   context.Context
	stop   context.CancelFunc
	done   chan struct{}
	once   sync.Once
	closed sync.Once
}

var _ Session = (*session)(nil)

func (s *session) end() { s.once.Do(func() { close(s.done) }) }

// Policy is the policy the session was created with.
func (s *session) Policy() Policy { return s.policy }

// WorkingDir is the working directory in the sandbox.
func (s *session) WorkingDir() string { return s.wd }

// Done is closed when the session ends: closed, its sandbox or pod gone, or its guard lost.
func (s *session) Done() <-chan struct{} { return s.done }

// Alive reports whether the session is still active.
func (s *session) Alive() bool {
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

// bound is ctx, also cancelled when the session ends (its guard lost, its pod gone).
func (s *session) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.life, cancel)
	return ctx, func() { stop(); cancel() }
}

func (s *session) resolve(path string) (string, error) {
	if path == "" {
		return s.wd, nil
	}
	if !strings.HasPrefix(path, "/") {
		path = s.wd + "/" + path
	}
	return agentbox.Confine(root(s.policy), path)
}

func (s *session) env(extra map[string]string) map[string]string {
	env := make(map[string]string, len(s.policy.Env)+len(extra))
	for k, v := range s.policy.Env {
		env[k] = v
	}
	for k, v := range extra {
		env[k] = v
	}
	return env
}

// Exec runs a shell command line and waits for it: in the session's persistent shell, or as
// a one-shot exec when it reads stdin. A timeout is a result with TimedOut (the command's
// process group was killed), not an error.
func (s *session) Exec(ctx context.Context, command string, opts ExecOptions) (ExecResult, error) {
	if !s.Alive() {
		return ExecResult{}, ErrClosed
	}
	wd, err := s.resolve(opts.WorkingDir)
	if err != nil {
		return ExecResult{}, err
	}
	o := agentbox.ExecOptions{Stdin: opts.Stdin, Env: s.env(opts.Env), Workdir: wd, Timeout: opts.Timeout}
	if o.Timeout == 0 {
		o.Timeout = s.policy.Timeout
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	start := time.Now()
	var r *agentbox.ExecResult
	if opts.Stdin != nil {
		r, err = s.sbx.Run(ctx, command, o)
	} else {
		r, err = s.shell.Run(ctx, command, o)
	}
	var te *agentbox.ExecTimeoutError
	if errors.As(err, &te) && te.Result != nil {
		r, err = te.Result, nil
	}
	if err != nil {
		if s.life.Err() != nil {
			return ExecResult{}, fmt.Errorf("%w: %v", ErrClosed, err)
		}
		return ExecResult{}, err
	}
	return ExecResult{ExitCode: r.ExitCode, Stdout: r.Stdout, Stderr: r.Stderr, TimedOut: r.TimedOut, Duration: time.Since(start)}, nil
}

type process struct{ p *agentbox.Process }

func (h process) Stdin() io.WriteCloser { return h.p.Stdin }
func (h process) Stdout() io.Reader     { return h.p.Stdout }
func (h process) Stderr() io.Reader     { return h.p.Stderr }
func (h process) Kill() error           { return h.p.Kill() }
func (h process) Wait() (int, error) {
	st, err := h.p.Wait()
	if err != nil {
		return -1, err
	}
	if !st.HasCode {
		return -1, fmt.Errorf("the process ended without an exit code: %s", st.Message)
	}
	return st.Code, nil
}

// StartProcess starts a long-lived process whose stdin, stdout and stderr are the handle's
// streams (a streaming exec); it ends with the session.
func (s *session) StartProcess(ctx context.Context, req ProcessRequest) (ProcessHandle, error) {
	if !s.Alive() {
		return nil, ErrClosed
	}
	wd, err := s.resolve(req.WorkingDir)
	if err != nil {
		return nil, err
	}
	ctx, cancel := s.bound(ctx)
	p, err := s.sbx.Start(ctx, req.Command, agentbox.ExecOptions{Env: s.env(req.Env), Workdir: wd})
	if err != nil {
		cancel()
		return nil, err
	}
	go func() {
		<-p.Done()
		cancel()
	}()
	return process{p}, nil
}

// ResolvePath translates a sandbox path (relative to the working directory, or absolute
// under the root) to the workspace's directory on the node, when this process sees it (as on
// a one-node cluster where the runner runs on the node); otherwise ErrNoHostPath: use
// Files().
func (s *session) ResolvePath(path string) (string, error) {
	p, err := s.resolve(path)
	if err != nil {
		return "", err
	}
	host := s.host
	if host == "" {
		return "", fmt.Errorf("%w (sandbox %s has no host directory in its status)", ErrNoHostPath, s.sbx.Name())
	}
	if st, err := os.Stat(host); err != nil || !st.IsDir() {
		return "", fmt.Errorf("%w (%s is not a directory here)", ErrNoHostPath, host)
	}
	rel := strings.TrimPrefix(strings.TrimPrefix(p, root(s.policy)), "/")
	return filepath.Join(host, filepath.FromSlash(rel)), nil
}

// Close ends the session: its shell, its watches, and the scope's guard (released).
func (s *session) Close() error {
	var err error
	s.closed.Do(func() {
		_ = s.shell.Close()
		s.stop()
		s.end()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err = s.guard.Release(ctx)
	})
	return err
}

// Files is the session's file access over the API server (paths as for ResolvePath).
func (s *session) Files() FileSystem { return files{s} }

// FilesOf is the FileSystem of a session made by this package (nil for another).
func FilesOf(s Session) FileSystem {
	if f, ok := s.(interface{ Files() FileSystem }); ok {
		return f.Files()
	}
	return nil
}

type files struct{ s *session }

func (f files) ctx() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	c2, c := f.s.bound(ctx)
	return c2, func() { c(); cancel() }
}

func (f files) ReadFile(name string) ([]byte, error) {
	p, err := f.s.resolve(name)
	if err != nil {
		return nil, err
	}
	ctx, cancel := f.ctx()
	defer cancel()
	b, err := f.s.sbx.ReadFile(ctx, p)
	return b, fsErr("read", name, err)
}

func (f files) WriteFile(name string, data []byte, perm fs.FileMode) error {
	p, err := f.s.resolve(name)
	if err != nil {
		return err
	}
	ctx, cancel := f.ctx()
	defer cancel()
	return fsErr("write", name, f.s.sbx.WriteFile(ctx, p, data, perm&fs.ModePerm))
}

func (f files) Stat(name string) (fs.FileInfo, error) {
	p, err := f.s.resolve(name)
	if err != nil {
		return nil, err
	}
	ctx, cancel := f.ctx()
	defer cancel()
	e, err := f.s.sbx.Stat(ctx, p)
	if err != nil {
		return nil, fsErr("stat", name, err)
	}
	return info{e}, nil
}

func (f files) ReadDir(name string) ([]fs.DirEntry, error) {
	p, err := f.s.resolve(name)
	if err != nil {
		return nil, err
	}
	ctx, cancel := f.ctx()
	defer cancel()
	es, err := f.s.sbx.ReadDir(ctx, p)
	if err != nil {
		return nil, fsErr("readdir", name, err)
	}
	out := make([]fs.DirEntry, len(es))
	for i, e := range es {
		out[i] = fs.FileInfoToDirEntry(info{e})
	}
	return out, nil
}

// fsErr is a *fs.PathError, with fs.ErrNotExist for a missing file, so os-style callers
// (errors.Is(err, fs.ErrNotExist)) work.
func fsErr(op, name string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, agentbox.ErrFileNotFound) {
		err = fmt.Errorf("%w: %v", fs.ErrNotExist, err)
	}
	return &fs.PathError{Op: op, Path: name, Err: err}
}

type info struct{ e agentbox.DirEntry }

func (i info) Name() string       { return i.e.Name }
func (i info) Size() int64        { return i.e.Size }
func (i info) ModTime() time.Time { return time.Unix(i.e.MTime, 0) }
func (i info) IsDir() bool        { return i.e.Kind == agentbox.KindDir }
func (i info) Sys() any           { return i.e }
func (i info) Mode() fs.FileMode {
	m := fs.FileMode(i.e.Mode & 0o777)
	switch i.e.Kind {
	case agentbox.KindDir:
		m |= fs.ModeDir
	case agentbox.KindSymlink:
		m |= fs.ModeSymlink
	case agentbox.KindOther:
		m |= fs.ModeIrregular
	}
	return m
}
